"""Build the small local models used by the real-vLLM tests.

Run with the vLLM virtualenv's python (it has torch, transformers and
tokenizers); it never touches the network:

    <vllm-venv>/bin/python tests/realserver/build_model.py tiny  OUT_DIR
    <vllm-venv>/bin/python tests/realserver/build_model.py dummy139m OUT_DIR

``tiny``: LlamaForCausalLM with random weights (hidden 256, 2 layers, 4 heads,
2 KV heads, intermediate 512, vocab 4096; about 2.2 M parameters), saved with
``save_pretrained`` together with a byte-level BPE tokenizer and a chat
template.

``dummy139m``: only ``config.json`` (hidden 1024, 12 layers, 16 heads, 4 KV
heads, intermediate 2816; about 139 M parameters) plus the same tokenizer, to
be served with ``--load-format dummy``.

The script is self-contained (no imports from the llmdiag tree) because it runs
in a different interpreter.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VOCAB_SIZE = 4096
MAX_POSITIONS = 4096
# Cap the training text so the build takes seconds and is deterministic.
MAX_TRAIN_BYTES = 8 * 1024 * 1024

SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]

# Minimal ChatML-like template; enough for /v1/chat/completions to work.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _training_files() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        parts = set(path.relative_to(stdlib).parts)
        if "site-packages" in parts or "test" in parts or "tests" in parts:
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        files.append(str(path))
        total += size
        if total >= MAX_TRAIN_BYTES:
            break
    if not files:
        raise SystemExit(f"no training text found under {stdlib}")
    return files


def build_tokenizer(out: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    files = _training_files()
    print(f"training BPE tokenizer (vocab {VOCAB_SIZE}) on {len(files)} stdlib files", file=sys.stderr)
    bpe = ByteLevelBPETokenizer()
    bpe.train(files=files, vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False)
    bos_id = bpe.token_to_id("<s>")
    bpe.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out))


def _llama_config(**kw):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=0,  # "<s>" is the first special token
        eos_token_id=1,  # "</s>"
        pad_token_id=3,  # "<pad>"
        tie_word_embeddings=True,
        dtype="bfloat16",
        **kw,
    )


def build_tiny(out: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    build_tokenizer(out)
    torch.manual_seed(0)
    cfg = _llama_config(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {n / 1e6:.2f} M parameters", file=sys.stderr)
    model.save_pretrained(str(out))
    _write_generation_config(out)


def build_dummy139m(out: Path) -> None:
    build_tokenizer(out)
    cfg = _llama_config(
        hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816
    )
    cfg.architectures = ["LlamaForCausalLM"]  # set by the model class otherwise
    cfg.save_pretrained(str(out))
    _write_generation_config(out)
    h, layers, inter, v, kv = 1024, 12, 2816, VOCAB_SIZE, 4
    head = h // 16
    per_layer = h * h * 2 + h * head * kv * 2 + 3 * h * inter + 2 * h
    n = layers * per_layer + v * h + h  # tied input/output embeddings
    print(f"dummy model: {n / 1e6:.1f} M parameters (config only)", file=sys.stderr)


def _write_generation_config(out: Path) -> None:
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}, indent=2) + "\n"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("tiny", "dummy139m"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if argv[1] == "tiny":
        build_tiny(out)
    else:
        build_dummy139m(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
