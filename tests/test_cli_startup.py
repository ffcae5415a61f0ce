"""--help, --version and a refused flag answer before any heavy import: the parser's modules
import no torch, torchvision, timm, onnx, scikit-learn or matplotlib (what makes a start cost
seconds of CPU; benchmarks/startup.py measures it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "timm", "onnx", "onnxruntime", "sklearn", "matplotlib",
         "scipy", "numpy")
PROBE = """
import sys
HEAVY = sys.argv.pop(1).split(",")
sys.argv = ["compress_classifier.py", *sys.argv[1:]]
from compressor.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
heavy = sorted(set(name.split(".")[0] for name in sys.modules) & set(HEAVY))
print("HEAVY", ",".join(heavy), file=sys.stderr)
sys.exit(status)
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["--epochs", "-1"],
                                  ["--lr", "abc"], ["--target-macs", "2"]],
                         ids=["help", "version", "epochs", "lr", "target-macs"])
def test_the_parser_imports_nothing_heavy(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *argv],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    heavy = next(line for line in result.stderr.splitlines() if line.startswith("HEAVY"))
    assert heavy == "HEAVY ", heavy
    if argv[0] in ("--help", "--version"):
        assert result.returncode == 0 and "compress_classifier.py" in result.stdout
    else:
        assert result.returncode == 2
        refusal = [line for line in result.stderr.splitlines() if not line.startswith("HEAVY")]
        assert len(refusal) == 1 and refusal[0].startswith("compress_classifier.py: error:")


def test_version_names_the_package_version() -> None:
    import compressor

    result = subprocess.run([sys.executable, str(ROOT / "compress_classifier.py"), "--version"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.stdout.strip() == f"compress_classifier.py (compressor {compressor.__version__})"


def test_the_vocabulary_names_what_the_modules_act_on() -> None:
    """The parser's torch-free names are the ones the heavy modules act on."""
    from compressor.quantization.core.clipping import ClipMode
    from compressor.quantization.core.range_linear import LinearQuantMode
    from compressor.utils.precision import AMP_DTYPES
    from compressor.utils.vocabulary import AMP_NAMES, CLIP_MODE_NAMES, QUANT_MODE_NAMES

    assert CLIP_MODE_NAMES == tuple(mode.name.lower() for mode in ClipMode)
    assert set(QUANT_MODE_NAMES.values()) == {mode.name for mode in LinearQuantMode}
    assert tuple(AMP_DTYPES) == AMP_NAMES


def test_one_quantization_vocabulary_for_the_command_line_the_yaml_and_the_api() -> None:
    """The command line and the API take Distiller's names as its YAML does, and the YAML
    takes the command line's: the same modes, whatever the spelling."""
    from compressor.api.quantize import _choice
    from compressor.cli.parser import parse_args
    from compressor.quantization.core.settings import settings_from_args
    from compressor.utils.vocabulary import CLIP_MODE_NAMES, clip_mode_name, quant_mode_name

    args = parse_args(["-e", "--qe", "--qe-mode", "ASYMMETRIC_UNSIGNED", "--qema", "symmetric",
                       "--qe-clip-acts", "AVG", "-a", "simplenet_digits"])
    assert (args.qe_mode, args.qe_mode_acts, args.qe_clip_acts) == ("asym_u", "sym", "avg")
    assert _choice("clip", clip_mode_name("MSE"), CLIP_MODE_NAMES) == "mse"
    for short, distiller in (("sym", "SYMMETRIC"), ("asym_s", "ASYMMETRIC_SIGNED")):
        assert quant_mode_name(distiller) == quant_mode_name(short) == short
        assert (settings_from_args({"mode": short}, "yaml").mode
                == settings_from_args({"mode": distiller}, "yaml").mode)
