"""engine/worker/host_memory.py: the host's room, lowered to the cgroup's where one limits the process."""

from __future__ import annotations

from pathlib import Path

from engine.worker.host_memory import available_bytes


def _host(root: Path, available_kib: int, cgroup: tuple[str, str] | None) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: 24000000 kB\nMemFree: 1 kB\nMemAvailable: {available_kib} kB\n")
    (root / "proc/self/cgroup").write_text("0::/system.slice/pageserve-engine.service\n")
    group = root / "sys/fs/cgroup/system.slice/pageserve-engine.service"
    group.mkdir(parents=True)
    if cgroup is not None:
        (group / "memory.max").write_text(cgroup[0] + "\n")
        (group / "memory.current").write_text(cgroup[1] + "\n")
    return root


def test_the_smaller_of_the_hosts_and_the_cgroups_room(tmp_path: Path) -> None:
    assert available_bytes(_host(tmp_path / "a", 8 << 20, None)) == 8 << 30  # no cgroup files: the host's
    assert available_bytes(_host(tmp_path / "b", 8 << 20, ("max", "123"))) == 8 << 30  # no limit
    assert available_bytes(_host(tmp_path / "c", 8 << 20, (str(6 << 30), str(1 << 30)))) == 5 << 30
    assert available_bytes(_host(tmp_path / "d", 2 << 20, (str(6 << 30), str(1 << 30)))) == 2 << 30


def test_unknown_without_proc(tmp_path: Path) -> None:
    assert available_bytes(tmp_path) is None
    assert available_bytes() is not None  # this Linux host
