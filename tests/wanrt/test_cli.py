import subprocess
import sys

from wanrt.cli import build_parser, main


def test_help_lists_subcommands(capsys) -> None:  # type: ignore[no-untyped-def]
    parser = build_parser()
    text = parser.format_help()
    assert "demo" in text and "gateway" in text


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys; from wanrt.cli import build_parser; build_parser('gateway'); "
        "print(sorted(m for m in ('sklearn', 'torch', 'scipy', 'wanrt.demo.profile_cli', 'wanrt.demo.cli') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_command_prints_help() -> None:
    assert main([]) == 2


def test_import_has_no_side_effects() -> None:
    code = "import asyncio, wanrt, wanrt.cli, sys; print(type(asyncio.get_event_loop_policy()).__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "uvloop" not in out
