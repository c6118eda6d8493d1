"""The install step that pyproject.toml cannot declare: the C kernels compiled for this CPU into the package
(ridgeline/kernels/build.py), so the first start does not compile them. Everything else is in pyproject.toml."""
import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_with_kernels(build_py):
    def run(self):
        super().run()
        spec = importlib.util.spec_from_file_location("ridgeline_kernel_build", HERE / "ridgeline/kernels/build.py")
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        # an editable install runs the source tree: its library goes there; a wheel's into its build tree
        root = None if getattr(self, "editable_mode", False) else Path(self.build_lib)
        try:
            build.build_into_package(root, log=lambda m: self.announce(m, level=2) or print(m, flush=True))
        except RuntimeError as e:  # no compiler: the package still installs and says so at first use
            print(f"ridgeline: the C kernels were not built ({e}); they compile at first use", flush=True)


setup(cmdclass={"build_py": build_py_with_kernels})
