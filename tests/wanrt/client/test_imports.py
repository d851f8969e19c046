import subprocess
import sys


def test_import_wanrt_does_not_import_torch_until_a_client_name_is_used() -> None:
    code = (
        "import sys, wanrt, wanrt.client.config\n"
        "assert 'torch' not in sys.modules, 'import wanrt pulled in torch'\n"
        "wanrt.SparseOptimizer\n"
        "assert 'torch' in sys.modules\n"
        "assert wanrt.init is wanrt.client.init\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
