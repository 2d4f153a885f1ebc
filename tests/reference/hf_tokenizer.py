"""Encodes and decodes texts with a tokenizer directory through Hugging Face's AutoTokenizer.

usage: hf_tokenizer.py TOKENIZER_DIR TEXTS.json OUT.json
TEXTS is a JSON list of strings. OUT receives {"class": the tokenizer's class name,
"ids": the ids of each text as AutoTokenizer encodes it by default, "decoded": each decoded back}.
"""
import json
import sys

from transformers import AutoTokenizer


def main(directory, texts_path, out_path):
    tokenizer = AutoTokenizer.from_pretrained(directory)
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    ids = [tokenizer(text)["input_ids"] for text in texts]
    decoded = [tokenizer.decode(text_ids) for text_ids in ids]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"class": type(tokenizer).__name__, "ids": ids, "decoded": decoded}, f,
                  ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
