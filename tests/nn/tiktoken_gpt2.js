// tiktoken's GPT-2 (npm's `tiktoken` package, WASM, offline), the reference Cohort's tokenizer is
// checked and timed against (tests/nn/tokenizer_test.cc, bench/tokenizer_bench.sh). The package is
// installed by scripts/setup under $COHORT_NPM_DIR (default ~/.cache/cohort-npm).
//
//   node tiktoken_gpt2.js ranks OUT            GPT-2's ranks as a .tiktoken file (base64 bytes, rank)
//   node tiktoken_gpt2.js encode OUT FILE...   encode_ordinary of each file (read as UTF-8) into OUT:
//                                              per file a uint32 count, then its ids as uint32 (LE)
//   node tiktoken_gpt2.js bench FILE SECONDS   encode_ordinary of FILE repeated for SECONDS; prints
//                                              "tiktoken MB/s <figure> tokens <count>"
//   node tiktoken_gpt2.js shards SPEC.json     llm.c shards as `cohort tokenize` documents its rules
//                                              (cli/tokenize_command.h), written independently of it
//                                              from tiktoken's ids: SPEC {inputs, split (file, lines,
//                                              jsonl), valTokens, valFraction, shardTokens, outDir, name}
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

// Each document of the inputs as {text, offset}: offset is its first byte in the input, all files one
// after another. file: the whole file; lines: each non-empty line without its '\n'; jsonl: the "text"
// of each line that is not blank.
function documents(spec) {
  const docs = [];
  let base = 0;
  for (const file of spec.inputs) {
    const bytes = fs.readFileSync(file);
    if (spec.split === 'file') {
      docs.push({text: bytes.toString('utf8'), offset: base});
    } else {
      for (let start = 0; start < bytes.length;) {
        let end = bytes.indexOf(0x0a, start);
        if (end < 0) end = bytes.length;
        const line = bytes.subarray(start, end).toString('utf8');
        if (spec.split === 'lines' && line !== '') docs.push({text: line, offset: base + start});
        if (spec.split === 'jsonl' && !/^[ \t\r]*$/.test(line)) docs.push({text: JSON.parse(line).text, offset: base + start});
        start = end + 1;
      }
    }
    base += bytes.length;
  }
  return {docs, totalBytes: base};
}

function writeShard(spec, split, index, tokens) {
  const header = new Int32Array(256);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = tokens.length;
  const name = `${spec.outDir}/${spec.name}_${split}_${String(index).padStart(6, '0')}.bin`;
  fs.writeFileSync(name, Buffer.concat([Buffer.from(header.buffer), Buffer.from(Uint16Array.from(tokens).buffer)]));
}

function shards(specFile) {
  const spec = JSON.parse(fs.readFileSync(specFile, 'utf8'));
  const encoding = tiktoken.get_encoding('gpt2');
  const {docs, totalBytes} = documents(spec);
  const valBytes = Math.floor((spec.valFraction || 0) * totalBytes);
  const splits = {val: [], train: []};
  for (const doc of docs) {
    // valFraction: the documents that start within its bytes; valTokens: the stream's first N tokens.
    const inVal = splits.train.length === 0 && (spec.valTokens > 0 || doc.offset < valBytes);
    const into = inVal ? splits.val : splits.train;
    into.push(50256);
    for (const id of encoding.encode_ordinary(doc.text)) into.push(id);
  }
  if (spec.valTokens > 0) {
    splits.train = splits.val.slice(spec.valTokens);
    splits.val = splits.val.slice(0, spec.valTokens);
  }
  let index = 0;
  for (const split of ['val', 'train']) {
    for (let at = 0; at < splits[split].length; at += spec.shardTokens) {
      writeShard(spec, split, index++, splits[split].slice(at, at + spec.shardTokens));
    }
  }
  encoding.free();
}

const [command, ...args] = process.argv.slice(2);
if (command === 'ranks' && args.length === 1) {
  writeRanks(args[0]);
} else if (command === 'encode' && args.length >= 2) {
  encodeFiles(args[0], args.slice(1));
} else if (command === 'bench' && args.length === 2 && Number(args[1]) > 0) {
  bench(args[0], Number(args[1]));
} else if (command === 'shards' && args.length === 1) {
  shards(args[0]);
} else {
  fail('usage: ranks OUT | encode OUT FILE... | bench FILE SECONDS | shards SPEC.json');
}
