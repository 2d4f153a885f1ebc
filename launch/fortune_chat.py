"""Writes a small chat corpus made from the demo's fortunes, one conversation per JSONL line in
the "messages" shape that `mlprep --format chat` reads: a user asks for a fortune about a word
that the fortune holds, the assistant answers with the fortune; some conversations have a system
turn, some ask for a second one. Deterministic (no randomness beyond a fixed seed), standard
library only.

usage: python3 launch/fortune_chat.py [FORTUNE_FILE...] > fortune_chat.jsonl
(default: the English fortune files under /usr/share/games/fortunes)
"""
import glob
import json
import os
import random
import re
import sys

QUESTIONS = [
    "Tell me a fortune about {}.",
    "Do you have a saying about {}?",
    "What does the fortune cookie say about {}?",
    "Give me some wisdom on {}, please.",
]
CHINESE = {"chinese", "tang300", "song100"}  # the questions are English
SYSTEM = "You answer with a fortune, as a fortune cookie would."


def fortunes(paths):
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for fortune in re.split(r"^%\s*$", f.read(), flags=re.M):
                fortune = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", fortune).strip()
                if 0 < len(fortune) <= 400:
                    yield fortune


def topic(fortune):
    """The longest word of the fortune: what the question asks about."""
    words = re.findall(r"[A-Za-z]{4,}", fortune)
    return max(words, key=len).lower() if words else None


def main(paths):
    paths = paths or sorted(
        p for p in glob.glob("/usr/share/games/fortunes/*")
        if os.path.isfile(p) and not os.path.islink(p) and "." not in os.path.basename(p)
        and os.path.basename(p) not in CHINESE)
    rng = random.Random(1337)
    pending = None  # a fortune kept to answer the second question of the next conversation
    for fortune in fortunes(paths):
        word = topic(fortune)
        if word is None:
            continue
        messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.3 else []
        messages += [{"role": "user", "content": rng.choice(QUESTIONS).format(word)},
                     {"role": "assistant", "content": fortune}]
        if pending is not None:
            messages += [{"role": "user", "content": "Another one, please."},
                         {"role": "assistant", "content": pending}]
            pending = None
        elif rng.random() < 0.2:
            pending = fortune
            continue
        print(json.dumps({"messages": messages}, ensure_ascii=False))


if __name__ == "__main__":
    main(sys.argv[1:])
