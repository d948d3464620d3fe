#!/usr/bin/env bash
# bento's whole test run: start the local services (and install Chromium
# for the console's browser tests, and promtool for the alerting rules'
# check, if they are missing), check formatting and vet,
# run every test with the race detector, run the suite again without it (the
# stress tests skip under -race), run each benchmark once so they keep
# working, and vet and test the nested modules examples/redisbus and bench. Set CI=1 to
# make tests fail (not skip) when a service is down.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

bash scripts/services.sh
bash scripts/chromium.sh
bash scripts/promtool.sh

echo "== gofmt"
unformatted=$(gofmt -l .)
if [[ -n "$unformatted" ]]; then
	echo "gofmt needed on:"; echo "$unformatted"; exit 1
fi
echo "== go vet"
go vet ./...
echo "== go test -race"
go test -race -count=1 -timeout 20m ./...
echo "== go test (stress and chaos tests, which skip under -race)"
go test -count=1 -timeout 20m ./...
echo "== benchmarks, one iteration each"
go test -run '^$' -bench . -benchtime 1x -timeout 10m ./...
echo "== examples/redisbus (its own module): go vet, go test -race"
(cd examples/redisbus && go vet ./... && go test -race -count=1 -timeout 10m ./...)
echo "== bench (its own module): go vet, go test"
(cd bench && go vet ./... && go test -count=1 ./...)
