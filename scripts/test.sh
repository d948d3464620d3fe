#!/usr/bin/env bash
# bento's whole test run: start the local services (and install Chromium
# for the console's browser tests, and promtool for the alerting rules'
# check, if they are missing), check formatting and vet,
# run every test with the race detector, run the suite again without it (the
# stress tests skip under -race), run the fault campaigns of package chaos
# (fixed seeds plus a fresh one, printed), run each benchmark once so they keep
# working, vet and test the nested modules examples/redisbus and bench, and
# check that the tests left no queues behind on the local RabbitMQ. Set CI=1
# to make tests fail (not skip) when a service is down.
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
go vet -tags bento_putback ./consumer # the switches that put fixed bugs back (docs/chaos.md)
echo "== go test -race"
go test -race -count=1 -timeout 20m ./...
# The fault campaigns (package chaos) run in a step of their own below.
readonly campaigns='^(TestCampaign|TestCrashPoisonOnTheDatabaseBus|TestAccountsUnderFaults)$'
echo "== go test (stress and chaos tests, which skip under -race)"
# The consumer package's stress tests (workers with 1 s handlers, minutes
# of partition moves and link cuts) take 12 to 20 minutes on a loaded
# machine of two cores: 30 minutes, so that the time limit is not what fails.
go test -count=1 -timeout 30m -skip "$campaigns" ./...
echo "== fault campaigns: fixed seeds and one fresh seed, each run's report and timeline below"
go test -count=1 -timeout 40m -v -run "$campaigns" ./chaos
echo "== benchmarks, one iteration each"
go test -run '^$' -bench . -benchtime 1x -timeout 10m ./...
echo "== examples/redisbus (its own module): go vet, go test -race"
(cd examples/redisbus && go vet ./... && go test -race -count=1 -timeout 10m ./...)
echo "== bench (its own module): go vet, go test"
(cd bench && go vet ./... && go test -count=1 ./...)
echo "== test queues left on RabbitMQ"
# Every test deletes the queues it declares (internal/testenv's "bt."
# exchanges). A test that leaks them leaks on every run, and thousands of
# leftover queues wedge the broker: a systematic leak fails the run, a few
# (a cleanup that could not connect) are reported.
if [[ -z "${BENTO_TEST_AMQP_URL:-}" ]] && command -v rabbitmqctl >/dev/null; then
	left=$(timeout 60 rabbitmqctl -q list_queues name 2>/dev/null | grep -c '^bt\.' || true)
	echo "${left:-0} left"
	if ((${left:-0} > 50)); then
		timeout 60 rabbitmqctl -q list_queues name 2>/dev/null | grep '^bt\.' | sed -E 's/^bt\.[0-9a-f]+\.//' | sort | uniq -c | sort -rn | head -20
		echo "tests leaked RabbitMQ queues (above, by name after the exchange): register them with testenv.Exchange"
		exit 1
	fi
fi
