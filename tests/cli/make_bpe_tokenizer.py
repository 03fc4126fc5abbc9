#!/usr/bin/python3
"""A small byte-level BPE tokenizer made for a test, as a tiktoken .tiktoken rank file: ranks 0..255
are the bytes, then every prefix (from two bytes on) of the corpus's most frequent words (with their
leading space where they have one), shortest first, so that merging by rank builds each word from its
bytes. The id after the last rank is <|endoftext|>, as in tiktoken's GPT-2.
Usage: make_bpe_tokenizer.py CORPUS OUT WORDS; prints the vocabulary's size (with <|endoftext|>)."""
import base64, collections, re, sys

corpus, out, words = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(corpus, encoding="utf-8").read()
counts = collections.Counter(re.findall(r" ?[A-Za-z]+", text))
tokens = [bytes([b]) for b in range(256)]
seen = set(tokens)
for word, _ in counts.most_common(words):
    data = word.encode()
    for end in range(2, len(data) + 1):
        if data[:end] not in seen:
            seen.add(data[:end])
            tokens.append(data[:end])
with open(out, "w") as f:
    for rank, token in enumerate(tokens):
        f.write(f"{base64.b64encode(token).decode()} {rank}\n")
print(len(tokens) + 1)
