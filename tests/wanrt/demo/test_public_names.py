import subprocess
import sys


def test_demo_package_exports_resolve_lazily() -> None:
    code = (
        "import sys, wanrt.demo as d\n"
        "assert 'torch' not in sys.modules and 'gateways' not in sys.modules, 'import wanrt.demo is heavy'\n"
        "import wanrt.demo.workload, wanrt.demo.sites, wanrt.demo.trainers\n"
        "assert 'torch' not in sys.modules, 'a demo subpackage imported torch'\n"
        "assert sorted(d.__all__) == sorted(d.EXPORTS)\n"
        "for name in d.__all__:\n"
        "    getattr(d, name)\n"
        "    assert name in d.__doc__, f'{name} missing from the package docstring'\n"
        "assert d.Demo.__module__ == 'wanrt.demo.runner' and d.QUICK.sites >= 1\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
