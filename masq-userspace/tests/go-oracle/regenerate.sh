#!/bin/sh
# Regenerates corpus.jsonl: gen.py writes the documents, main.go records what upstream's Go
# pipeline (go-yaml v2, sigs.k8s.io/yaml, encoding/json, net.ParseCIDR) says about each.
# Likewise go-compat/tests/routines.jsonl: single Go functions (strconv, time, net,
# encoding/json) on inputs no config file carries, which go-compat's own tests replay.
#
# Needs Go and the Go libraries from Debian, no module proxy:
#   apt-get install golang-go golang-k8s-sigs-yaml-dev golang-gopkg-yaml.v2-dev
# The replays (masq-userspace/tests/go_oracle.rs, go-compat/tests/go_routines.rs) only read
# the recorded answers: CI needs no Go.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
# GOPATH mode against /usr/share/gocode, where Debian's golang-*-dev packages install.
mkdir -p "$build/src/go-oracle"
cp "$here/main.go" "$build/src/go-oracle/"
GOPATH="$build:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOCACHE="$build/cache" \
    go build -o "$build/go-oracle" go-oracle
routines_dir=$(cd "$here/../../../go-compat/tests" && pwd)
for kind in corpus routines; do
    out="$here/$kind.jsonl"
    [ "$kind" = routines ] && out="$routines_dir/$kind.jsonl"
    python3 "$here/gen.py" $kind | "$build/go-oracle" > "$out.new"
    mv "$out.new" "$out"
    echo "$(wc -l < "$out") cases written to $out"
done
