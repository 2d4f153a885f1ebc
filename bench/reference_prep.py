"""The Python side of bench/prep.sh, and the token-id reference of mlprep's tests: a corpus
preparer in the style of llm.c's fineweb.py, written for the benchmark. Documents come from jsonl
files (plain, gzip or zstd, told by their first bytes), Python's sentencepiece encodes them in a
multiprocessing pool, and numpy writes llm.c token shards of --shard-tokens tokens, each document
followed by the end-of-document token. There is no validation split: every document goes to
train_NNNNNN.bin in input order, so `mlprep --val-fraction 0` with the same tokenizer must write
the same bytes.
"""
import argparse
import gzip
import json
import multiprocessing as mp
import os
import subprocess

import numpy as np
import sentencepiece as spm

processor = None  # each worker's own SentencePiece model


def load_model(path):
    global processor
    processor = spm.SentencePieceProcessor(model_file=path)


def encode(text):
    return processor.encode(text)


def open_lines(path):
    """The file's lines as text, decompressed as its first bytes say."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    if magic == b"\x28\xb5\x2f\xfd":
        # No zstd module in this Python: the zstd tool decompresses into a pipe.
        return subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE, text=True,
                                encoding="utf-8").stdout
    return open(path, encoding="utf-8")


def documents(paths, field):
    for path in paths:
        with open_lines(path) as lines:
            for line in lines:
                if line.strip():
                    text = json.loads(line)[field]
                    if text:
                        yield text


def write_shard(out, index, tokens, wide):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = (20240801, 7, len(tokens)) if wide else (20240520, 1, len(tokens))
    with open(os.path.join(out, f"train_{index:06d}.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--text-field", default="text")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    load_model(args.tokenizer)
    end_of_document = processor.eos_id()
    wide = processor.get_piece_size() > 65536
    shard = np.empty(args.shard_tokens, dtype=np.uint32 if wide else np.uint16)
    filled, index, total = 0, 0, 0
    with mp.Pool(args.threads, initializer=load_model, initargs=(args.tokenizer,)) as pool:
        for tokens in pool.imap(encode, documents(args.input, args.text_field), chunksize=64):
            tokens.append(end_of_document)
            total += len(tokens)
            while tokens:
                taken = min(len(tokens), args.shard_tokens - filled)
                shard[filled:filled + taken] = tokens[:taken]
                filled += taken
                tokens = tokens[taken:]
                if filled == args.shard_tokens:
                    write_shard(args.out, index, shard, wide)
                    filled, index = 0, index + 1
    if filled:
        write_shard(args.out, index, shard[:filled], wide)
    print(f"tokens {total}")


if __name__ == "__main__":
    main()
