"""The hypervisor's share of the CPUs over an interval, from /proc/stat's steal column."""
from ridgeline.utils.steal import StealMeter, read_ticks


def _stat(path, user, idle, steal):
    path.write_text(f"cpu  {user} 0 0 {idle} 0 0 0 {steal} 7 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")


def test_share_of_all_cpu_time_stolen(tmp_path):
    p = tmp_path / "stat"
    _stat(p, 1000, 500, 100)
    assert read_ticks(str(p)) == (100, 1600)  # guest time (the ninth column) is inside user already
    meter = StealMeter(str(p))
    _stat(p, 1700, 600, 300)  # 1000 more ticks, 200 of them stolen
    assert meter.fraction() == 0.2


def test_unknown_when_the_kernel_does_not_say(tmp_path):
    p = tmp_path / "stat"
    p.write_text("intr 1 2 3\n")
    assert read_ticks(str(p)) is None and StealMeter(str(p)).fraction() is None
    assert StealMeter(str(tmp_path / "missing")).fraction() is None
