# The helpers install-controller and install-node share (sourced by both, from this checkout,
# before they read their arguments). They expect, by the time they are called: me (the script's
# name), R (the --root, "" for /), live (1: this very system), changes (a count that changed()
# raises), here (the checkout), python, source_path, pip_args.
# Every install pins the run-time stack with conf/constraints.txt (pip -c): a controller and a node
# installed a month apart get the same versions (scripts/lib/constraints.py regenerates it).

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }  # the script's header
die() { echo "$me: $*" >&2; exit 1; }
say() { echo "$me: $*"; }

changed() { changes=$((changes + 1)); say "$*"; }

# ---- small idempotent helpers -----------------------------------------------------------------
ensure_dir() {  # DIR MODE
    if [ ! -d "$1" ]; then mkdir -p "$1"; chmod "$2" "$1"; changed "created $1"
    elif [ "$(stat -c %a "$1")" != "${2#0}" ]; then chmod "$2" "$1"; changed "mode $2 on $1"; fi
}
put_file() {  # SRC DEST MODE: copy when missing or different
    if [ ! -f "$2" ] || ! cmp -s "$1" "$2"; then
        mkdir -p "$(dirname "$2")"; install -m "$3" "$1" "$2"; changed "installed $2"
    elif [ "$(stat -c %a "$2")" != "${3#0}" ]; then chmod "$3" "$2"; changed "mode $3 on $2"; fi
}
ensure_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ $live -eq 0 ]; then say "not installing ${missing[*]} (--root given)"; return 0; fi
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    changes=$((changes + 1))
}
source_fingerprint() {  # what a reinstall depends on: the wheel's bytes, or the checkout's sources
    if [ -f "$source_path" ]; then
        sha256sum < "$source_path"
    else
        (cd "$source_path" && find setup.cfg pyproject.toml hai_cluster migrations bin -type f \
            \( -name '*.py' -o -name '*.cfg' -o -name '*.toml' -o -name '*.mako' -o -name '*.c' -o -path 'bin/*' \) \
            -not -path '*/__pycache__/*' 2>/dev/null | LC_ALL=C sort | xargs sha256sum) | sha256sum
    fi
}
ensure_venv() {  # the package in /opt/hai-cluster/venv; sets venv_changed=1 when it (re)installed
    local venv=$R/opt/hai-cluster/venv want constraints=$here/conf/constraints.txt
    venv_changed=0
    [ -f "$constraints" ] || die "$constraints is missing: the versions every host installs come from it"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
        || die "$python is not a Python 3.11 or newer (use --python)"
    if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        "$python" -m venv "$venv"
        changed "created the virtualenv $venv"
    fi
    want=$( { source_fingerprint; echo "$pip_args"; cat "$constraints"; } | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$venv/.hai-cluster-source" 2>/dev/null || true)" != "$want" ]; then
        # Same version number, new code: pip would call it satisfied, so remove it first.
        "$venv/bin/python" -m pip uninstall -q -y hai-cluster >/dev/null 2>&1 || true
        # shellcheck disable=SC2086  # pip_args are words on purpose
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" $pip_args \
            "${source_path}[postgres]"
        echo "$want" > "$venv/.hai-cluster-source"
        venv_changed=1
        changed "installed hai-cluster from $source_path into $venv"
        # The C programs (hsubmit, squeue, sacct, hai-jobexec) where a compiler is (none is installed for them).
        if command -v "${CC:-cc}" >/dev/null 2>&1; then
            if "$venv/bin/python" -m hai_cluster.native.build >/dev/null; then
                changed "compiled the C hsubmit, squeue, sacct and hai-jobexec into $venv/bin"
            else
                say "warning: a C program did not compile (above); its Python way stays"
            fi
        fi
    fi
}
install_docs() {  # the checkout's docs and example configs beside the venv
    local f
    for f in README.md docs/OPERATIONS.md docs/BENCHMARKS.md conf/controller.toml conf/agent.toml \
             conf/hai-controller.service conf/hai-controller.socket conf/hai-agent.service \
             conf/constraints.txt; do
        [ -f "$here/$f" ] && put_file "$here/$f" "$R/opt/hai-cluster/$f" 0644
    done
    return 0
}
# The user commands in the system PATH: symlinks in /usr/local/bin to the venv's. Our own names with
# --link-commands; Slurm's (sbatch squeue ...) only with --slurm-names too, and never over a file
# that is not one of our links (a real Slurm client stays what `sbatch` runs).
OUR_COMMANDS="hsubmit hqueue hcancel hinfo hacct hcontrol hstat hshare"
SLURM_COMMANDS="sbatch srun salloc sattach squeue scancel sinfo sacct scontrol sshare sprio"
link_commands() {  # WHICH: "ours" or "ours slurm"
    local dir=$R/usr/local/bin venv=/opt/hai-cluster/venv/bin names=$OUR_COMMANDS c dest
    case $1 in *slurm*) names="$names $SLURM_COMMANDS" ;; esac
    mkdir -p "$dir"
    for c in $names; do
        dest=$dir/$c
        if [ -L "$dest" ] && [ "$(readlink "$dest")" = "$venv/$c" ]; then continue; fi
        if [ -e "$dest" ] || [ -L "$dest" ]; then
            say "warning: $dest exists and is not ours: left as it is (run $venv/$c, or remove it and run me again)"
            continue
        fi
        ln -s "$venv/$c" "$dest"
        changed "linked $dest -> $venv/$c"
    done
}
systemd_live() { [ $live -eq 1 ] && [ -d /run/systemd/system ]; }
