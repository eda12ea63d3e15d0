"""Which adapters this engine serves, by name, and which load of each a request runs under.

    name ──> load id (a new one per load, never reused) ──> LoraAdapter weights, or only
                                                           its folder and stamp while evicted
Requests resolve a name to a load id once, at admission, and keep it: unloading or reloading
a name never changes what a running request computes. A retired load (unloaded, or replaced by
a reload) keeps its weights until no live request holds it (`sweep`). Up to `max_cpu_loras`
adapters keep their weights resident; beyond that the least recently used ones that no live
request holds drop their weights, and a registered load costs only its name, path and stamp.
An evicted load is read again when a request names it, off the step loop (`reread`, run by
engine/worker/lora/evicted_reads.py), and only if the folder is unchanged: a changed file under
the same load id would break the prefix cache's promise, so it must be reloaded under a new id.
Nothing here walks every registered adapter on a step: each call costs O(1) or O(resident).
Knows nothing about scheduling or the model's layers.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.errors import LoraError, LoraNotFound
from shared.protocol import LORA_LOAD_BUCKETS


@dataclass(frozen=True)
class LoadStamp:
    """What identifies a folder's contents well enough to refuse re-reading a changed one."""

    path: str
    files: tuple[tuple[str, int, int], ...]
    """(file name, size, mtime in ns) of the folder's two files."""

    @staticmethod
    def of(path: str) -> LoadStamp:
        folder = Path(path)
        stats = [(n, (folder / n).stat()) for n in ("adapter_config.json", "adapter_model.safetensors")
                 if (folder / n).is_file()]
        return LoadStamp(path, tuple((n, s.st_size, s.st_mtime_ns) for n, s in stats))


@dataclass
class LoadTimes:
    """A histogram of read durations over LORA_LOAD_BUCKETS: fixed size however many loads there were."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LORA_LOAD_BUCKETS) + 1))
    """Reads per bucket (not cumulative); the last one is over the largest bound."""
    total_seconds: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LORA_LOAD_BUCKETS, seconds)] += 1
        self.total_seconds += seconds

    def cumulative(self) -> list[int]:
        """Prometheus' form: reads at or under each bound, then all of them."""
        return list(itertools.accumulate(self.counts))


Loader = Callable[[str, str, int], LoraAdapter]
"""(folder, name, load id) -> the adapter's weights (engine/worker/lora/adapter.py load_adapter, bound)."""


class LoraRegistry:
    def __init__(self, loader: Loader, max_cpu_loras: int) -> None:
        self._loader = loader
        self.max_cpu_loras = max_cpu_loras
        self._names: dict[str, int] = {}  # name -> its current load id
        self._stamps: dict[int, tuple[str, LoadStamp]] = {}  # load id -> (name, folder stamp), live or retired
        self._resident: OrderedDict[int, LoraAdapter] = OrderedDict()  # least recently used first
        self._retired: set[int] = set()
        self._next_id = 1  # 0 is the base model
        self.load_times = LoadTimes()
        """Reads from disk by duration (the metrics' load-latency histogram)."""
        self.evictions = 0

    def load(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter (LoraError on a bad one); a name already loaded is replaced."""
        load_id = self.reserve(name)
        began = time.perf_counter()
        adapter = self._loader(path, name, load_id)
        self.install(name, path, adapter, time.perf_counter() - began)
        return adapter

    def reserve(self, name: str) -> int:
        """A new load id for `name` (LoraError on a bad name). Reading with it (`read`) may then run on another
        thread, off the step loop; `install` makes it current. An id whose read failed is never used."""
        if not name or "=" in name:
            raise LoraError(f"adapter name {name!r} is empty or contains '='")
        load_id = self._next_id
        self._next_id += 1
        return load_id

    def read(self, path: str, name: str, load_id: int) -> LoraAdapter:
        """Read and check the folder (LoraError naming the problem). Touches no registry state: thread-safe."""
        return self._loader(path, name, load_id)

    def install(self, name: str, path: str, adapter: LoraAdapter, seconds: float) -> None:
        """Make an adapter read from `path` current as `name` (on the step loop); the load it replaces is retired."""
        load_id = adapter.load_id
        self.load_times.observe(seconds)
        old = self._names.get(name)
        if old is not None:
            self._retired.add(old)
        self._names[name] = load_id
        self._stamps[load_id] = (name, LoadStamp.of(path))
        self._resident[load_id] = adapter

    def unload(self, name: str) -> None:
        """Retire `name`: new requests no longer find it; running ones finish on its weights."""
        load_id = self._names.pop(name, None)
        if load_id is None:
            raise LoraNotFound(f"the adapter {name!r} is not loaded")
        self._retired.add(load_id)

    def resolve(self, name: str) -> int:
        """The current load id of `name` (LoraNotFound when none). Reads nothing: an evicted load's weights
        come back through `reread`, off the loop; a changed folder is a LoraError at once (a stat, no read)."""
        load_id = self._names.get(name)
        if load_id is None:
            raise LoraNotFound(f"the model {name!r} does not exist")
        if load_id not in self._resident:
            self._check_unchanged(load_id)
        return load_id

    def is_resident(self, load_id: int) -> bool:
        return load_id in self._resident

    def adapter(self, load_id: int) -> LoraAdapter:
        """A resident load's weights (KeyError otherwise: the scheduler runs no row of an evicted load)."""
        adapter = self._resident[load_id]
        self._resident.move_to_end(load_id)
        return adapter

    def reread(self, load_id: int) -> Callable[[], LoraAdapter]:
        """What reads an evicted load's folder again: safe on another thread (it touches no registry state);
        a LoraError when the files changed since the load, checked before and after the read."""
        name, stamp = self._stamps[load_id]

        def read() -> LoraAdapter:
            _check_stamp(name, stamp)
            adapter = self._loader(stamp.path, name, load_id)
            _check_stamp(name, stamp)  # changed while it was read: the weights may be a mix
            return adapter
        return read

    def reinstall(self, adapter: LoraAdapter, seconds: float) -> bool:
        """On the loop: an evicted load's weights read again are resident (most recently used). False, and
        nothing kept, when the load was forgotten meanwhile (retired and no longer held)."""
        self.load_times.observe(seconds)
        if adapter.load_id not in self._stamps:
            return False
        self._resident[adapter.load_id] = adapter
        return True

    def sweep(self, live_ids: Iterable[int]) -> None:
        """Forget retired loads no live request holds; drop least recently used weights over the cap."""
        live = set(live_ids)
        for load_id in [i for i in self._retired if i not in live]:
            self._retired.discard(load_id)
            self._stamps.pop(load_id, None)
            self._resident.pop(load_id, None)
        for load_id in list(self._resident):
            if len(self._resident) <= self.max_cpu_loras:
                break
            if load_id not in live:
                del self._resident[load_id]
                self.evictions += 1

    def needs_sweep(self) -> bool:
        return bool(self._retired) or len(self._resident) > self.max_cpu_loras

    def names(self) -> list[str]:
        return sorted(self._names)

    @property
    def num_resident(self) -> int:
        return len(self._resident)

    @property
    def num_loaded(self) -> int:
        """Names that serve requests (O(1), unlike `names`)."""
        return len(self._names)

    def _check_unchanged(self, load_id: int) -> None:
        _check_stamp(*self._stamps[load_id])


def _check_stamp(name: str, stamp: LoadStamp) -> None:
    if LoadStamp.of(stamp.path) != stamp:
        raise LoraError(f"the files of adapter {name!r} changed on disk since it was loaded: load it again")
