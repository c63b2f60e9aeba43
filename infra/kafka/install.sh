#!/usr/bin/env bash
# Fetch Apache Kafka (the broker, org.apache.kafka:kafka_2.13) and its runtime dependencies
# from Maven Central into .cache/kafka/<version>/libs, for `koordstream broker --kafka` and
# the tests. Idempotent: does nothing when that folder is complete (it holds .complete).
# Needs Maven (mvn) and, to run the broker, Java 17 or later.
#   infra/kafka/install.sh            # into <repo>/.cache/kafka/<version>/libs
#   KOORDSTREAM_KAFKA_LIBS=DIR infra/kafka/install.sh   # into DIR instead
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
pom="$here/pom.xml"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom" | head -n 1)"
libs="${KOORDSTREAM_KAFKA_LIBS:-$root/.cache/kafka/$version/libs}"

if [[ -f "$libs/.complete" ]]; then
    exit 0
fi
command -v mvn >/dev/null || { echo "install.sh: Maven (mvn) is needed to fetch Apache Kafka $version" >&2; exit 1; }

# Copy into a scratch folder beside the target and move it in whole, so an interrupted
# run never leaves a folder that looks complete.
mkdir -p "$(dirname "$libs")"
scratch="$(mktemp -d "$(dirname "$libs")/.libs.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
echo "fetching Apache Kafka $version and its dependencies into $libs" >&2
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$scratch" >&2
ls "$scratch"/kafka_2.13-"$version".jar >/dev/null
touch "$scratch/.complete"
rm -rf "$libs"
mv "$scratch" "$libs"
trap - EXIT
