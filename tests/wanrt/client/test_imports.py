import subprocess
import sys


def test_import_wanrt_does_not_import_torch_until_a_client_name_is_used() -> None:
    code = (
        "import sys, wanrt, wanrt.client.config\n"
        "import wanrt.client.site, wanrt.client.leader, wanrt.client.link\n"
        "assert 'torch' not in sys.modules, 'import wanrt pulled in torch'\n"
        "wanrt.SparseOptimizer\n"
        "assert 'torch' in sys.modules\n"
        "assert wanrt.init is wanrt.client.init\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_public_name_resolves_and_is_listed() -> None:
    code = (
        "import wanrt, wanrt.client as c\n"
        "assert sorted(c.__all__) == sorted(c.EXPORTS) and set(c.__all__) <= set(dir(c))\n"
        "for name in c.__all__:\n"
        "    obj = getattr(c, name)\n"
        "    assert obj.__name__ == name, name\n"
        "    assert name in c.__doc__, f'{name} missing from the package docstring'\n"
        "for name in ('init', 'SparseOptimizer', 'DiLoCo', 'Context', 'ClientConfig'):\n"
        "    assert getattr(wanrt, name) is getattr(c, name)\n"
        "try:\n"
        "    c.site_message\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('an unknown name resolved')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
