"""Build a tiny random Llama with a locally trained tokenizer (no hub): `python tinymodel.py OUT_DIR`.

Run by the real-SGLang venv's Python (it needs torch, transformers and tokenizers, which optagent
itself does not). Everything is seeded: the same script builds the same weights and tokenizer, so a
greedy completion of a prompt is the same on every machine. The sizes are the smallest SGLang's CPU
path serves: head_dim 32 (its CPU attention refuses 16), two layers, a 2,048-token vocabulary.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 2048
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus(seed: int = 0, lines: int = 2000) -> list[str]:
    """English-looking text to train the tokenizer on: words of a seeded made-up vocabulary."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "an", "el", "or", "us", "ith"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(4000)]
    return [" ".join(rng.choice(words) for _ in range(30)) + "." for _ in range(lines)]


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    (out / "optagent-tiny.json").write_text(json.dumps({"vocab": len(fast), "seed": 0}) + "\n")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
