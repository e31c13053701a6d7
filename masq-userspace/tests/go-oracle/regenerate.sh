#!/bin/sh
# Regenerates corpus.jsonl: gen.py writes the documents, main.go records what upstream's Go
# pipeline (go-yaml v2, sigs.k8s.io/yaml, encoding/json, net.ParseCIDR) says about each.
#
# Needs Go and the Go libraries from Debian, no module proxy:
#   apt-get install golang-go golang-k8s-sigs-yaml-dev golang-gopkg-yaml.v2-dev
# The corpus test (masq-userspace/tests/go_oracle.rs) only reads corpus.jsonl: CI needs no Go.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
# GOPATH mode against /usr/share/gocode, where Debian's golang-*-dev packages install.
mkdir -p "$build/src/go-oracle"
cp "$here/main.go" "$build/src/go-oracle/"
GOPATH="$build:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOCACHE="$build/cache" \
    go build -o "$build/go-oracle" go-oracle
python3 "$here/gen.py" | "$build/go-oracle" > "$here/corpus.jsonl.new"
mv "$here/corpus.jsonl.new" "$here/corpus.jsonl"
echo "$(wc -l < "$here/corpus.jsonl") cases written to $here/corpus.jsonl"
