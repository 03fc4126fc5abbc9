// tiktoken's GPT-2 (npm's `tiktoken` package, WASM, offline), the reference Cohort's tokenizer is
// checked and timed against (tests/nn/tokenizer_test.cc, bench/tokenizer_bench.sh). The package is
// installed by scripts/setup under $COHORT_NPM_DIR (default ~/.cache/cohort-npm).
//
//   node tiktoken_gpt2.js ranks OUT            GPT-2's ranks as a .tiktoken file (base64 bytes, rank)
//   node tiktoken_gpt2.js encode OUT FILE...   encode_ordinary of each file (read as UTF-8) into OUT:
//                                              per file a uint32 count, then its ids as uint32 (LE)
//   node tiktoken_gpt2.js bench FILE SECONDS   encode_ordinary of FILE repeated for SECONDS; prints
//                                              "tiktoken MB/s <figure> tokens <count>"
// Exit 2 with one line when the package is missing or an argument is wrong.
'use strict';
const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(`tiktoken_gpt2.js: ${message}\n`);
  process.exit(2);
}

const npmDir = process.env.COHORT_NPM_DIR || path.join(process.env.HOME || '/root', '.cache', 'cohort-npm');
const packageDir = path.join(npmDir, 'node_modules', 'tiktoken');
let tiktoken;
try {
  tiktoken = require(packageDir);
} catch (e) {
  fail(`npm's tiktoken is not installed at ${packageDir} (run scripts/setup): ${e.message.split('\n')[0]}`);
}

function writeRanks(out) {
  const data = JSON.parse(fs.readFileSync(path.join(packageDir, 'encoders', 'gpt2.json'), 'utf8'));
  // bpe_ranks: lines of "<label> <first rank> <base64 token> <base64 token> ...", ranks counting up.
  const lines = [];
  for (const line of data.bpe_ranks.split('\n')) {
    if (line === '') continue;
    const fields = line.split(' ');
    const first = Number(fields[1]);
    fields.slice(2).forEach((token, i) => lines.push(`${token} ${first + i}`));
  }
  fs.writeFileSync(out, lines.join('\n') + '\n');
}

function encodeFiles(out, files) {
  const encoding = tiktoken.get_encoding('gpt2');
  const chunks = [];
  for (const file of files) {
    const ids = encoding.encode_ordinary(fs.readFileSync(file, 'utf8'));
    const header = new Uint32Array([ids.length]);
    chunks.push(Buffer.from(header.buffer), Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength));
  }
  fs.writeFileSync(out, Buffer.concat(chunks));
  encoding.free();
}

function bench(file, seconds) {
  const encoding = tiktoken.get_encoding('gpt2');
  const text = fs.readFileSync(file, 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  encoding.encode_ordinary(text);  // warm up
  let rounds = 0;
  let tokens = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  do {
    tokens = encoding.encode_ordinary(text).length;
    ++rounds;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  } while (elapsed < seconds);
  console.log(`tiktoken MB/s ${(bytes * rounds / elapsed / 1e6).toFixed(2)} tokens ${tokens}`);
  encoding.free();
}

const [command, ...args] = process.argv.slice(2);
if (command === 'ranks' && args.length === 1) {
  writeRanks(args[0]);
} else if (command === 'encode' && args.length >= 2) {
  encodeFiles(args[0], args.slice(1));
} else if (command === 'bench' && args.length === 2 && Number(args[1]) > 0) {
  bench(args[0], Number(args[1]));
} else {
  fail('usage: ranks OUT | encode OUT FILE... | bench FILE SECONDS');
}
