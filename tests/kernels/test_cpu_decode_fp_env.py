import subprocess
import sys

# A subprocess: the point is the state of a fresh process after the native kernel loads.
CODE = """
from pageserve_kernels import cpu_decode
assert cpu_decode.load() is not None, "the native decode kernel did not build"
tiny = 2.2250738585072014e-308 / 4  # a subnormal: flushed to 0.0 under flush-to-zero
print(tiny != 0.0)
"""


def test_loading_the_native_kernel_keeps_subnormals():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
