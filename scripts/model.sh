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

# Configurations. Every run is exhaustive within its bounds (spin's -DCOLLAPSE state
# store, no hashing). No single bound set runs in minutes with everything at once on a
# 2-core machine, so the checks are split over configurations, each small enough to
# search whole; docs/MODEL.md ("Configurations") says what each restricts and why the
# restriction does not hide what it targets. Every configuration a mutant is refuted
# in is also checked without the mutant: the model holds there.
#   RACE:    two replicas, every loop on both, every reservation may lapse at any
#            moment (LAPSE_ANYTIME): any interleaving of two replicas on one batch
#   FAULTS:  one replica; a kill, a lost GitLab answer, a human action, a retry, a
#            foreign MR on batch 1's branch (merged, open or none)
#   LATE:    two replicas; A only publishes, may be killed once and its lease may lapse
#            once while it is in an item; B runs every loop; a human acts once
#   LIVE:    two replicas with leases, one lapse and a human; the timeout sweep runs on
#            B only (liveness with two replicas, see docs/MODEL.md)
#   QUEUE:   one replica, two operations approved one after the other
#   CLAIMS:  two replicas, A only claims; a retry (two batches)
#   FOREIGN: one replica, no faults, a foreign MR on batch 1's branch
RACE="-DNR=2 -DNO=1 -DNRETRY=0 -DKILLS=0 -DLOSSES=0 -DHUMAN=0 -DNO_FOREIGN -DLAPSE_ANYTIME"
FAULTS="-DNR=1 -DNO=1 -DNRETRY=1 -DKILLS=1 -DLOSSES=1 -DHUMAN=1"
LATE="-DNR=2 -DNO=1 -DNRETRY=0 -DKILLS=1 -DLOSSES=0 -DHUMAN=1 -DFREEZES=1 -DNO_FOREIGN -DROLE0=L_PUB -DKILLWHO=1 -DFREEZEWHO=1"
LIVE="-DNR=2 -DNO=1 -DNRETRY=0 -DKILLS=0 -DLOSSES=0 -DHUMAN=1 -DFREEZES=1 -DNO_FOREIGN -DROLE0=L_NOT_TMO"
QUEUE="-DNR=1 -DNO=2 -DNRETRY=0 -DKILLS=0 -DLOSSES=0 -DHUMAN=0 -DNO_FOREIGN"
CLAIMS="-DNR=2 -DNO=1 -DNRETRY=1 -DKILLS=0 -DLOSSES=0 -DHUMAN=0 -DNO_FOREIGN -DROLE0=L_CLAIM"
FOREIGN="-DNR=1 -DNO=1 -DNRETRY=0 -DKILLS=0 -DLOSSES=0 -DHUMAN=0"

work=$(mktemp -d "${TMPDIR:-/tmp}/batcherd-model.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The verifier of a configuration: spin -a, then gcc. Only the searches of the large
# configurations are worth an optimised verifier: a search that must find a
# counterexample stops at the first one, and a small configuration is searched in
# less time than gcc -O2 takes to build it. LTL runs of one configuration share one
# verifier.
build() { # build DIR BOUNDS DEFS KIND OPT
	local dir=$1 bounds=$2 defs=$3 kind=$4 opt=$5
	[ -x "$dir/pan" ] && return 0
	mkdir -p "$dir"
	cp "$pml" "$dir/batcherd.pml"
	(
		cd "$dir"
		if [ "$kind" = safety ]; then
			spin -a $bounds $defs -DQUIET batcherd.pml >spin.out 2>&1
			gcc $opt -w -DSAFETY -DNOCLAIM -DCOLLAPSE -DVECTORSZ=2048 -DMEMLIM=3000 -o pan pan.c
		else
			spin -a $bounds $defs batcherd.pml >spin.out 2>&1
			gcc $opt -w -DNFAIR=4 -DCOLLAPSE -DVECTORSZ=2048 -DMEMLIM=3000 -o pan pan.c
		fi
	)
}

# run NAME BOUNDS DEFINES PROPERTY EXPECT [MENTION]
#   PROPERTY: safety (the assertions: I1, I2, no false merge, fenced arm, a SUCCEEDED
#             batch names its MR, and in every quiet state p_fence, p_agree and p_done)
#             or an LTL formula of the model (searched under weak fairness)
#   EXPECT:   hold (no error may be found) or fail (a counterexample must be found)
#   MENTION:  for fail, text spin's report of the violation must contain: the mutant
#             is refuted by the property its guard protects, not by another
failures=0
run() {
	local name=$1 bounds=$2 defs=$3 prop=$4 expect=$5 mention=${6:-}
	local kind=ltl opt=-O0 width=-w20
	[ "$prop" = safety ] && kind=safety
	case "$expect/$name" in
	hold/race | hold/faults | hold/late | hold/live) opt=-O2 width=-w24 ;;
	esac
	local key
	key=$(printf '%s' "$kind $opt $bounds $defs" | md5sum | cut -c1-12)
	local dir="$work/$key" out="$work/$name-$prop.out"
	local start end states verdict=ok
	start=$(date +%s.%N)
	if ! build "$dir" "$bounds" "$defs" "$kind" "$opt"; then
		echo "model: $name/$prop: spin or gcc failed" >&2
		cat "$dir/spin.out" >&2 || true
		failures=$((failures + 1))
		return
	fi
	rm -f "$dir/batcherd.pml.trail"
	if [ "$kind" = safety ]; then
		(cd "$dir" && ./pan -m2000000 $width >"$out" 2>&1) || true
	else
		(cd "$dir" && ./pan -a -f -m2000000 $width -N "$prop" >"$out" 2>&1) || true
	fi
	end=$(date +%s.%N)
	local errors
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | head -1)
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$out" | head -1)
	if grep -q "out of memory\|max search depth too small\|VECTORSZ" "$out"; then
		verdict="INCOMPLETE"
	elif [ "$expect" = hold ] && [ "${errors:-1}" != 0 ]; then
		verdict="VIOLATED"
	elif [ "$expect" = fail ] && [ "${errors:-0}" = 0 ]; then
		verdict="NOT-CAUGHT"
	elif [ "$expect" = fail ] && [ -n "$mention" ] && ! grep -E "^pan:1:" "$out" | grep -qF -- "$mention"; then
		verdict="OTHER-PROPERTY"
	fi
	local what
	what=$(grep -E "^pan:1:" "$out" | head -1 | sed 's/^pan:1: //; s/ (at depth.*//' | cut -c1-60)  || true
	printf '%-20s %-8s %-5s %-14s %10s %7.1fs  %s %s\n' "$name" "$prop" "$expect" "$verdict" \
		"${states:-?}" "$(echo "$end - $start" | bc)" "$defs" "${what:+[$what]}"
	if [ "$verdict" != ok ]; then
		failures=$((failures + 1))
		grep -E "pan:|assertion|acceptance|errors" "$out" | head -5 | sed 's/^/    /'
		if [ -f "$dir/batcherd.pml.trail" ]; then
			local q=""
			[ "$kind" = safety ] && q=-DQUIET
			(cd "$dir" && spin -t -p -g $bounds $defs $q batcherd.pml 2>&1 | tail -40 | sed 's/^/    /') || true
		fi
	fi
}

printf '%-20s %-8s %-5s %-14s %10s %8s  %s\n' config property want verdict states time "defines [violation]"

if [ "$mode" = quick ]; then
	# The suite's slice: the model's safety with two racing replicas, the small
	# configurations with and without their mutants, and a fencing mutant.
	run race "$RACE" "" safety hold
	run queue "$QUEUE" "" safety hold
	run foreign "$FOREIGN" "" safety hold
	run no-slot "$QUEUE" "-DNO_SLOT" safety fail "(t<=1)"
	run adopt-any "$FOREIGN" "-DADOPT_ANY" safety fail "rhas[j]"
	run no-fence-record "$LATE" "-DNO_FENCE_RECORD" safety fail "m_ours"
	run no-lapse-timeout "$LIVE" "-DNO_LAPSE_TIMEOUT" p_done fail "acceptance cycle"
else
	# The model, in every configuration. Safety runs also check p_fence, p_agree and
	# p_done in every quiet state (spin's weak-fairness search reports cycles only,
	# not a run that ends); LTL runs check them on every fair infinite run.
	run race "$RACE" "" safety hold
	run faults "$FAULTS" "" safety hold
	run late "$LATE" "" safety hold
	run live "$LIVE" "" safety hold
	run live "$LIVE" "" p_done hold
	run live "$LIVE" "" p_agree hold
	run live "$LIVE" "" p_fence hold
	run queue "$QUEUE" "" safety hold
	run claims "$CLAIMS" "" safety hold
	run foreign "$FOREIGN" "" safety hold
	# The mutants: each guard removed, and the property it protects must fail, in a
	# configuration the model holds in (above).
	run no-slot "$QUEUE" "-DNO_SLOT" safety fail "(t<=1)"
	run no-claim-guard "$CLAIMS" "-DNO_SLOT -DNO_CLAIM_GUARD" safety fail "(inb<=1)"
	run adopt-any "$FOREIGN" "-DADOPT_ANY" safety fail "rhas[j]"
	run no-fence-record "$LATE" "-DNO_FENCE_RECORD" safety fail "m_ours"
	run no-version-guard "$LATE" "-DNO_VERSION_GUARD" safety fail "m_ours"
	run no-merged-wins "$LATE" "-DNO_MERGED_WINS" safety fail "bmerged"
	run no-unrecorded-sweep "$LATE" "-DNO_UNRECORDED_SWEEP" safety fail "bmerged"
	run recorded-first "$LATE" "-DRECORDED_FIRST" safety fail "bmerged"
	run lost-record-in-memory "$LATE" "-DLOST_RECORD_IN_MEMORY" safety fail "b_mr["
	run no-reread "$FAULTS" "-DNO_REREAD" safety fail "==rhas[0]"
	run no-lapse-timeout "$LIVE" "-DNO_LAPSE_TIMEOUT" p_done fail "acceptance cycle"
fi

if [ "$failures" != 0 ]; then
	echo "model: $failures check(s) failed" >&2
	exit 1
fi
echo "model: the model holds every property and every mutant is caught"
