"""GuideLLM, the load-generator baseline of bench/bench_client.py, in its own virtualenv outside the repository.

Everything lives under ``${LLMDIAG_CACHE_DIR:-~/.cache/llmdiag}`` (bench/venv_cache.py):

* ``guidellm-0.8.1/``               the virtualenv: ``guidellm[perf]==0.8.1`` and the CPU wheel ``torch==2.13.0``
                                    (plain ``pip install guidellm`` pulls a 6 GB CUDA torch); ≈ 1 min, ≈ 1.5 GB
* ``guidellm-0.8.1/tokenizer/``     an offline tokenizer directory: a BPE trained with ``tokenizers`` on the Faker
                                    text that GuideLLM's synthetic_text data is made of (Metaspace: every word of it
                                    one token, so that GuideLLM's prompt_tokens equal the simulator's word count),
                                    saved through transformers' ``PreTrainedTokenizerFast``; GuideLLM needs one and
                                    would otherwise try the Hugging Face hub

A stamp file (``.llmdiag-guidellm-complete.json``) in each makes it idempotent: a second run checks them and returns;
a stamp that is missing or names other versions rebuilds only that part.

    .venv/bin/python bench/guidellm_env.py          # build (or find) it; prints the guidellm command and tokenizer
    .venv/bin/python bench/guidellm_env.py --check  # also runs a 3 s guidellm against the simulator on loopback
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sim_process import SimProcess
from venv_cache import build_lock, cache_dir

GUIDELLM_VERSION = "0.8.1"
TORCH_VERSION = "2.13.0"
PIP_SPECS = (f"guidellm[perf]=={GUIDELLM_VERSION}", f"torch=={TORCH_VERSION}")
VENV_NAME = f"guidellm-{GUIDELLM_VERSION}"
STAMP = ".llmdiag-guidellm-complete.json"
TOKENIZER_BUILD_VERSION = 2  # bump when TOKENIZER_SCRIPT changes

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "DO_NOT_TRACK": "1",
}

# Runs inside the GuideLLM venv (tokenizers and transformers come with guidellm).
TOKENIZER_SCRIPT = r"""
import sys
from faker import Faker
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out = sys.argv[1]
fake = Faker()
fake.seed_instance(0)
lines = [fake.text(max_nb_chars=2000) for _ in range(3000)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Metaspace()
tok.decoder = decoders.Metaspace()
trainer = trainers.BpeTrainer(vocab_size=16000, special_tokens=["<unk>", "<s>", "</s>"])
tok.train_from_iterator(lines, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               model_max_length=131072)
fast.save_pretrained(out)
sample = fake.text(max_nb_chars=3000)
ids = fast.encode(sample, add_special_tokens=False)
print("tokenizer", out, "vocab", fast.vocab_size, f"tokens per word {len(ids) / len(sample.split()):.3f}",
      "round trip", fast.decode(ids) == sample)
"""


def _log(msg: str) -> None:
    print(f"[guidellm-env] {msg}", flush=True)


def venv_path() -> Path:
    return cache_dir() / VENV_NAME


def guidellm_bin() -> Path:
    return venv_path() / "bin" / "guidellm"


def tokenizer_dir() -> Path:
    return venv_path() / "tokenizer"


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
    return {**env, **OFFLINE_ENV}


def _run(cmd: Sequence[str | Path], what: str) -> None:
    _log(f"{what}: {' '.join(c if len(c) < 200 else '<script>' for c in map(str, cmd))}")
    started = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], env=offline_env() | {"PIP_NO_INPUT": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    _log(f"{what}: done in {time.monotonic() - started:.0f} s")


def _read_stamp(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_stamp(path: Path, content: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**content, "created_at": time.time()}, indent=2) + "\n")
    tmp.replace(path)


def _venv_stamp() -> dict:
    return {"pip": list(PIP_SPECS), "python": f"{sys.version_info.major}.{sys.version_info.minor}"}


def venv_ready() -> bool:
    stamp = _read_stamp(venv_path() / STAMP)
    return all(stamp.get(k) == v for k, v in _venv_stamp().items()) and guidellm_bin().exists()


def tokenizer_ready() -> bool:
    stamp = _read_stamp(tokenizer_dir() / STAMP)
    return stamp.get("build") == TOKENIZER_BUILD_VERSION and (tokenizer_dir() / "tokenizer.json").exists()


def is_ready() -> bool:
    return venv_ready() and tokenizer_ready()


def _base_python() -> str:
    base = getattr(sys, "_base_executable", None)
    return base if base and os.path.exists(base) else sys.executable


def ensure() -> Path:
    """The venv and its tokenizer, each built when its stamp is missing or outdated. Returns the venv's path."""
    venv = venv_path()
    if is_ready():
        _log(f"already built: {venv} and {tokenizer_dir()} (stamps {STAMP}); nothing to do")
        return venv
    with build_lock(VENV_NAME):
        if not venv_ready():
            if venv.exists():
                _log(f"removing incomplete or outdated {venv}")
                shutil.rmtree(venv)
            _log(f"installing {' '.join(PIP_SPECS)} into {venv} (≈ 1 min, ≈ 1.5 GB)")
            _run([_base_python(), "-m", "venv", venv], "create venv")
            _run([venv / "bin" / "python", "-m", "pip", "install", "-q", *PIP_SPECS], "pip install")
            _run([guidellm_bin(), "--version"], "guidellm --version")
            _write_stamp(venv / STAMP, _venv_stamp())
        else:
            _log(f"venv already built: {venv}")
        if not tokenizer_ready():
            shutil.rmtree(tokenizer_dir(), ignore_errors=True)
            _run([venv / "bin" / "python", "-c", TOKENIZER_SCRIPT, tokenizer_dir()], "train the offline tokenizer")
            _write_stamp(tokenizer_dir() / STAMP, {"build": TOKENIZER_BUILD_VERSION})
        _log(f"ready: {guidellm_bin()}, tokenizer {tokenizer_dir()}")
    return venv


def guidellm_command(
    url: str, model: str, streams: int, seconds: float, prompt_tokens: int, output_tokens: int, out_json: Path
) -> list[str]:
    """``guidellm run`` for a closed loop of ``streams`` concurrent streaming requests for ``seconds``."""
    return [
        str(guidellm_bin()),
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={model}",
        "--profile",
        f"kind=concurrent,streams={streams}",
        "--constraint",
        f"kind=max_duration,seconds={seconds:g}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer_dir()}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
        "--output",
        f"kind=json,path={out_json}",
        "--disable-progress",
    ]


def check_against_sim() -> int:
    """A 3 s, 8-stream guidellm run against ``llmdiag sim serve`` on loopback; prints the JSON's top keys."""
    with SimProcess("healthy") as sim, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "guidellm.json"
        cmd = guidellm_command(sim.url, sim.model, 8, 3, 64, 16, out)
        _log(" ".join(cmd))
        proc = subprocess.run(cmd, env=offline_env(), capture_output=True, text=True, timeout=180)
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        if proc.returncode != 0 or not out.exists():
            _log(f"guidellm failed: exit {proc.returncode}")
            return 1
        _log(f"guidellm exit 0, wrote {out.stat().st_size} bytes; top-level keys: {list(json.loads(out.read_text()))}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="also run a short guidellm against the simulator")
    args = parser.parse_args()
    ensure()
    print(f"guidellm:  {guidellm_bin()}")
    print(f"tokenizer: {tokenizer_dir()}")
    return check_against_sim() if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
