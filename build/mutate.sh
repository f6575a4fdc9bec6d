#!/usr/bin/env bash
# mutate.sh breaks each safety rule of build/mutations.txt once, runs the
# tests that claim to defend it, puts the file back and says whether they
# caught it (docs/testing.md). A mutation whose original text is not in its
# file exactly once no longer applies (the code moved): that is a failure,
# never a silent pass. A mutation that does not compile is a failure too.
#
#   build/mutate.sh            every mutation
#   MUTATE_ONLY=regex build/mutate.sh   those whose rule or name matches
#
# Exit 0 only when every mutation applied and was caught.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
LIST=${MUTATIONS:-build/mutations.txt}
ONLY=${MUTATE_ONLY:-}

work=$(mktemp -d)
current="" # the file a mutation is applied to, restored on any exit
child=""   # the go test running, stopped on an interrupt
restore() {
	if [[ -n $current ]]; then
		cp -p "$work/original" "$current"
		current=""
	fi
}
trap 'restore; rm -rf "$work"' EXIT
trap 'restore; [[ -n $child ]] && kill "$child" 2>/dev/null; echo "mutate: interrupted; files restored" >&2; exit 130' INT TERM HUP

# gotest ARGS...: go test into $work/out, in the background so that an
# interrupt runs the trap at once (bash defers it while a foreground
# command runs); its status is go test's.
gotest() {
	$GO test "$@" >"$work/out" 2>&1 &
	child=$!
	local rc=0
	wait "$child" || rc=$?
	child=""
	return "$rc"
}

# apply FILE ORIG REPL: replace ORIG's text with REPL's in FILE, only if
# it occurs exactly once.
apply() {
	perl -e '
		local $/;
		open(my $f, "<", $ARGV[0]) or die "$ARGV[0]: $!\n"; my $s = <$f>; close $f;
		open(my $o, "<", $ARGV[1]) or die; my $orig = <$o>; close $o;
		open(my $r, "<", $ARGV[2]) or die; my $repl = <$r>; close $r;
		$orig =~ s/\n+\z/\n/; $repl =~ s/\n+\z/\n/;
		my $n = () = $s =~ /\Q$orig\E/g;
		if ($n != 1) { print STDERR "found $n times\n"; exit 3 }
		substr($s, index($s, $orig), length $orig) = $repl;
		open(my $w, ">", $ARGV[0]) or die "$ARGV[0]: $!\n"; print $w $s; close $w;
	' "$1" "$2" "$3"
}

total=0 caught=0
declare -A baseline=()
failures=()

# run_one: the mutation parsed into rule, name, file, pkg, run, timeout and
# its npairs edits, $work/orig.N and $work/repl.N.
run_one() {
	if [[ -n $ONLY && ! "$rule: $name" =~ $ONLY ]]; then
		return
	fi
	total=$((total + 1))
	local label="[$rule] $name"
	local key="$pkg $run"
	# The tests must pass on the code as it is, or a failure proves nothing.
	if [[ -z ${baseline[$key]:-} ]]; then
		if gotest -timeout "$timeout" "$pkg" -run "$run"; then
			baseline[$key]=ok
		else
			baseline[$key]=fail
			sed 's/^/    /' "$work/out" | tail -20
		fi
	fi
	if [[ ${baseline[$key]} != ok ]]; then
		echo "NOT CAUGHT  $label: its tests ($pkg -run '$run') fail without the mutation"
		failures+=("$label")
		return
	fi
	if [[ ! -f $file ]]; then
		echo "NOT CAUGHT  $label: $file does not exist (mutation no longer applies)"
		failures+=("$label")
		return
	fi
	cp -p "$file" "$work/original"
	current=$file
	local why i
	for ((i = 1; i <= npairs; i++)); do
		if ! why=$(apply "$file" "$work/orig.$i" "$work/repl.$i" 2>&1); then
			restore
			echo "NOT CAUGHT  $label: mutation no longer applies to $file (original text $i $why)"
			failures+=("$label")
			return
		fi
	done
	local start=$SECONDS rc=0
	gotest -count=1 -timeout "$timeout" "$pkg" -run "$run" || rc=$?
	restore
	local took=$((SECONDS - start))s
	if grep -qE '\[(build|setup) failed\]|^# ' "$work/out"; then
		echo "NOT CAUGHT  $label: the mutated code does not build ($took)"
		sed 's/^/    /' "$work/out" | head -10
		failures+=("$label")
	elif ((rc == 0)); then
		echo "NOT CAUGHT  $label: $pkg -run '$run' passed ($took)"
		failures+=("$label")
	else
		caught=$((caught + 1))
		echo "caught      $label ($took)"
		# The first failure lines: they name the rule.
		grep -E '^\s+[A-Za-z0-9_]+\.go:[0-9]+: ' "$work/out" | head -2 | cut -c1-220 | sed 's/^\s*/              /'
	fi
}

rule="" name="" file="" pkg="" run="" timeout="" section="" npairs=0
flush() {
	if [[ -n $rule ]]; then
		if [[ -z $file || -z $pkg || -z $run || $npairs == 0 || ! -s $work/orig.1 ]]; then
			echo "mutate: $LIST: mutation \"$name\" lacks file:, test: or its original text" >&2
			exit 2
		fi
		run_one
	fi
	rule="" name="" file="" pkg="" run="" timeout="120s" section="" npairs=0
	rm -f "$work"/orig.* "$work"/repl.*
}
while IFS= read -r line || [[ -n $line ]]; do
	case $section in
	orig | repl)
		case $line in
		'+++ replacement') section=repl; : >"$work/repl.$npairs"; continue ;;
		'=== '* | '--- original') ;; # the next mutation, or the next edit of this one
		*) printf '%s\n' "$line" >>"$work/$section.$npairs"; continue ;;
		esac
		;;
	esac
	case $line in
	'=== '*) flush; rule=${line#=== } ;;
	'name: '*) name=${line#name: } ;;
	'file: '*) file=${line#file: } ;;
	'test: '*)
		read -r pkg run timeout2 <<<"${line#test: }"
		timeout=${timeout2:-120s}
		;;
	'--- original')
		npairs=$((npairs + 1))
		section=orig
		: >"$work/orig.$npairs"
		;;
	'#'* | '') ;;
	*) echo "mutate: $LIST: cannot read line: $line" >&2; exit 2 ;;
	esac
done <"$LIST"
flush

echo
echo "$caught of $total caught (${SECONDS}s)"
if ((${#failures[@]} > 0)); then
	printf 'not caught: %s\n' "${failures[@]}"
	exit 1
fi
