"""Renders chat conversations by the chat templates' definition (data/chat_template.h), with
SentencePiece's own Python package, and makes the tokenizers the C++ tests render with.

usage:
  chat_render.py render MODEL TEMPLATE CONVERSATIONS.jsonl OUT.json
      OUT receives, for each line of CONVERSATIONS (in either JSONL shape), {"tokens": [...],
      "targets": [...]}: the ids and whether each is a training target (1) or not (0).
  chat_render.py train-llama-like TEXT.txt VOCAB_SIZE MODEL_PREFIX
      Trains a BPE model the way Llama's tokenizers are made: a dummy prefix, <s> and </s>.

The rendering is written from the template's text, not from mltrain's code: each stretch of text
between markers is encoded alone, a marker is its piece's id, and a text opening with a space
drops it for a tokenizer that puts a space mark before every text it encodes.
"""
import json
import sys

import sentencepiece as spm

SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


def turns(conversation):
    if "messages" in conversation:
        return [(m["role"], m["content"]) for m in conversation["messages"]]
    return [(SHAREGPT_ROLES[m["from"]], m["value"]) for m in conversation["conversations"]]


def render(sp, template, conversation):
    tokens, targets = [], []
    dummy_prefix = sp.id_to_piece(sp.encode("a")[0]).startswith("\u2581")

    def text(value, target=False):
        if dummy_prefix and value.startswith(" "):
            value = value[1:]
        ids = sp.encode(value)
        tokens.extend(ids)
        targets.extend([int(target)] * len(ids))

    def marker(piece, target=False):
        piece_id = sp.piece_to_id(piece)
        assert sp.id_to_piece(piece_id) == piece, piece
        tokens.append(piece_id)
        targets.append(int(target))

    if template == "chatml":
        for role, content in turns(conversation):
            answer = role == "assistant"
            marker("<|im_start|>")
            text(role + "\n")
            text(content, answer)
            marker("<|im_end|>", answer)
            text("\n")
    else:  # llama2
        system = ""
        for role, content in turns(conversation):
            if role == "system":
                system += content
            elif role == "user":
                marker("<s>")
                block = f"<<SYS>>\n{system}\n<</SYS>>\n\n" if system else ""
                text(f"[INST] {block}{content} [/INST]")
                system = ""
            else:
                text(" " + content, True)
                marker("</s>", True)
    return {"tokens": tokens, "targets": targets}


def main(command, *arguments):
    if command == "render":
        model, template, conversations_path, out_path = arguments
        sp = spm.SentencePieceProcessor(model_file=model)
        with open(conversations_path, encoding="utf-8") as f:
            rendered = [render(sp, template, json.loads(line)) for line in f if line.strip()]
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(rendered, f)
    elif command == "train-llama-like":
        text_path, vocab_size, prefix = arguments
        spm.SentencePieceTrainer.train(
            input=text_path, model_prefix=prefix, vocab_size=int(vocab_size), model_type="bpe",
            byte_fallback=True, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            character_coverage=1.0, minloglevel=2)
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main(*sys.argv[1:])
