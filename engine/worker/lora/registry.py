"""Which adapters this engine serves, by name, and which load of each a request runs under.

    name ──> load id (a new one per load, never reused) ──> LoraAdapter weights, or only
                                                           its folder while evicted
Requests resolve a name to a load id once, at admission, and keep it: unloading or reloading
a name never changes what a running request computes. A retired load (unloaded, or replaced by
a reload) keeps its weights until no live request holds it (`sweep`). Up to `max_cpu_loras`
adapters keep their weights resident; beyond that the least recently used ones that no live
request holds drop their weights and are read again from their folder on next use (only if
the folder is unchanged: a changed file under the same load id would break the prefix cache's
promise, so it must be reloaded under a new id). Knows nothing about scheduling or the model's layers.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.errors import LoraError, LoraNotFound


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
        self.load_seconds: list[float] = []
        """Seconds of each load from disk, in order (the metrics' load-latency histogram reads them)."""
        self.evictions = 0

    def load(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter (LoraError on a bad one); a name already loaded is replaced."""
        if not name or "=" in name:
            raise LoraError(f"adapter name {name!r} is empty or contains '='")
        load_id = self._next_id
        adapter = self._read(path, name, load_id)
        self._next_id += 1
        old = self._names.get(name)
        if old is not None:
            self._retired.add(old)
        self._names[name] = load_id
        self._stamps[load_id] = (name, LoadStamp.of(path))
        self._resident[load_id] = adapter
        return adapter

    def unload(self, name: str) -> None:
        """Retire `name`: new requests no longer find it; running ones finish on its weights."""
        load_id = self._names.pop(name, None)
        if load_id is None:
            raise LoraNotFound(f"the adapter {name!r} is not loaded")
        self._retired.add(load_id)

    def resolve(self, name: str) -> int:
        """The current load id of `name` (LoraNotFound when none); its weights resident from now on."""
        load_id = self._names.get(name)
        if load_id is None:
            raise LoraNotFound(f"the model {name!r} does not exist")
        self.adapter(load_id)
        return load_id

    def adapter(self, load_id: int) -> LoraAdapter:
        adapter = self._resident.get(load_id)
        if adapter is not None:
            self._resident.move_to_end(load_id)
            return adapter
        name, stamp = self._stamps[load_id]
        if LoadStamp.of(stamp.path) != stamp:
            raise LoraError(f"the files of adapter {name!r} changed on disk since it was loaded: load it again")
        adapter = self._resident[load_id] = self._read(stamp.path, name, load_id)
        return adapter

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

    def _read(self, path: str, name: str, load_id: int) -> LoraAdapter:
        began = time.perf_counter()
        adapter = self._loader(path, name, load_id)
        self.load_seconds.append(time.perf_counter() - began)
        return adapter
