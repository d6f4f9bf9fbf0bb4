#!/usr/bin/env bash
# Model-check the protocol model (model/batcherd.pml) with spin: the model must hold
# every property, and every mutant (the model with one guard removed, selected by a -D
# flag) must be caught, i.e. spin must find a counterexample. docs/MODEL.md explains
# the model, the properties and the mutants.
#
#   scripts/model.sh            the full run (make model): larger bounds
#   scripts/model.sh quick      the suite's slice (go test ./model): smaller bounds
#   scripts/model.sh deps       only make sure spin and a C compiler are installed
#
# Exit status 0 only when the model holds and every mutant is caught.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
pml="$here/model/batcherd.pml"
mode=${1:-full}

install_deps() {
	if command -v spin >/dev/null && command -v gcc >/dev/null && command -v bc >/dev/null; then
		return 0
	fi
	echo "model: installing spin, gcc and bc (Debian packages)" >&2
	local sudo=""
	if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
	$sudo apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq spin gcc bc >/dev/null
}

install_deps
[ "$mode" = deps ] && exit 0

case "$mode" in
full | quick) ;;
*)
	echo "usage: $0 [full|quick|deps]" >&2
	exit 2
	;;
esac

# Bounds. Every run is exhaustive within its bounds. No single bound set runs in
# minutes with everything at once on a 2-core machine, so the checks are split over
# configurations (docs/MODEL.md, "Bounds"):
#   RACE:   two replicas racing on one operation (one batch), no faults
#   RACE2:  the same with a retry (two batches)
#   FAULTS: one replica, one operation that can be retried (two batches), one kill,
#           one lost GitLab answer, one human action, a foreign MR on batch 1's branch
#   QUEUE:  one replica, two operations approved one after the other
RACE="-DNR=2 -DNO=1 -DNRETRY=0 -DKILLS=0 -DLOSSES=0 -DHUMAN=0 -DNO_FOREIGN"
RACE2="-DNR=2 -DNO=1 -DNRETRY=1 -DKILLS=0 -DLOSSES=0 -DHUMAN=0 -DNO_FOREIGN"
FAULTS="-DNR=1 -DNO=1 -DNRETRY=1 -DKILLS=1 -DLOSSES=1 -DHUMAN=1"
QUEUE="-DNR=1 -DNO=2 -DNRETRY=0 -DKILLS=0 -DLOSSES=0 -DHUMAN=0 -DNO_FOREIGN"

work=$(mktemp -d "${TMPDIR:-/tmp}/batcherd-model.XXXXXX")
trap 'rm -rf "$work"' EXIT

# run NAME BOUNDS DEFINES PROPERTY EXPECT [bitstate]
#   PROPERTY: safety (assertions: I1, I2, no false merge) or an ltl name of the model
#   EXPECT:   hold (no error may be found) or fail (a counterexample must be found)
failures=0
run() {
	local name=$1 bounds=$2 defs=$3 prop=$4 expect=$5 search=${6:-exhaustive}
	local dir="$work/$name-$prop"
	local store="-DCOLLAPSE"
	[ "$search" = bitstate ] && store="-DBITSTATE"
	mkdir -p "$dir"
	cp "$pml" "$dir/batcherd.pml"
	local start end out errors states
	start=$(date +%s.%N)
	(
		cd "$dir"
		spin -a $bounds $defs batcherd.pml >spin.out 2>&1
		if [ "$prop" = safety ]; then
			gcc -O2 -w -DSAFETY -DNOCLAIM $store -DVECTORSZ=2048 -DMEMLIM=3000 $bounds $defs -o pan pan.c
			./pan -m2000000 -w26 >pan.out 2>&1 || true
		else
			gcc -O2 -w -DNFAIR=4 $store -DVECTORSZ=2048 -DMEMLIM=3000 $bounds $defs -o pan pan.c
			./pan -a -f -m2000000 -w26 -N "$prop" >pan.out 2>&1 || true
		fi
	) || { echo "model: $name/$prop: spin or gcc failed" >&2; cat "$dir/spin.out" >&2 || true; failures=$((failures + 1)); return; }
	end=$(date +%s.%N)
	out="$dir/pan.out"
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | head -1)
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$out" | head -1)
	local verdict=ok
	if grep -q "out of memory\|max search depth too small\|VECTORSZ" "$out"; then
		verdict="INCOMPLETE"
	elif [ "$expect" = hold ] && [ "${errors:-1}" != 0 ]; then
		verdict="VIOLATED"
	elif [ "$expect" = fail ] && [ "${errors:-0}" = 0 ]; then
		verdict="NOT-CAUGHT"
	fi
	printf '%-18s %-8s %-5s %-10s %10s %7.1fs  %s %s\n' "$name" "$prop" "$expect" "$verdict" \
		"${states:-?}" "$(echo "$end - $start" | bc)" "$search" "$defs"
	if [ "$verdict" != ok ]; then
		failures=$((failures + 1))
		grep -E "pan:|assertion|acceptance|errors" "$out" | head -5 | sed 's/^/    /'
		if [ -f "$dir/batcherd.pml.trail" ]; then
			(cd "$dir" && spin -t -p -g $bounds $defs batcherd.pml 2>&1 | tail -40 | sed 's/^/    /') || true
		fi
	fi
}

printf '%-18s %-8s %-5s %-10s %10s %8s  %s\n' variant property want verdict states time "search defines"

if [ "$mode" = quick ]; then
	# The suite's slice: the model's safety with two racing replicas, and the mutants
	# spin refutes within seconds.
	run model-race "$RACE" "" safety hold
	run no-slot "$QUEUE" "-DNO_SLOT" safety fail
	run adopt-any "$FAULTS" "-DADOPT_ANY" safety fail
	run no-lapse-timeout "$FAULTS" "-DNO_LAPSE_TIMEOUT" p_done fail
else
	# The model. Liveness (p_done, p_agree) with one replica: with two, spin finds
	# cycles in which the replicas keep taking the batch from each other, which the
	# model cannot exclude because it has no clock (docs/MODEL.md, "Bounds").
	run model-race "$RACE" "" safety hold
	run model-race "$RACE" "" p_fence hold
	run model-faults "$FAULTS" "" safety hold
	run model-faults "$FAULTS" "" p_fence hold
	run model-faults "$FAULTS" "" p_done hold
	run model-faults "$FAULTS" "" p_agree hold
	# The mutants: each guard removed, and the property it protects must fail.
	run no-slot "$QUEUE" "-DNO_SLOT" safety fail
	run no-claim-guard "$RACE2" "-DNO_SLOT -DNO_CLAIM_GUARD" safety fail
	run adopt-any "$FAULTS" "-DADOPT_ANY" safety fail
	run no-lapse-timeout "$FAULTS" "-DNO_LAPSE_TIMEOUT" p_done fail
fi

if [ "$failures" != 0 ]; then
	echo "model: $failures check(s) failed" >&2
	exit 1
fi
echo "model: the model holds every property and every mutant is caught"
