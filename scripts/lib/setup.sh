# Shared by scripts/test and scripts/quickstart: root, system packages, the virtualenv.
# Source it from the repository root; it sets: repo, as_root (array), venv.

repo=$(pwd)
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "$0: needs root, or sudo to become root" >&2
    exit 1
fi

# ensure_packages PKG...: apt-get install whatever is missing (apt-get update only then).
ensure_packages() {
    local missing=() p
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "$0: installing ${missing[*]}" >&2
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
}

# ensure_venv SPEC [ALSO...]: .venv with `pip install -e SPEC`, skipped when nothing changed since
# last time. ALSO: specs that install is known to cover (".[test]" covers "."), stamped with it, so
# that a later `ensure_venv ALSO` (the quickstart, run by the tests while others run beside it)
# finds the venv current and does not reinstall the package under the running tests' feet.
# The system interpreter comes first: the CLI and jobs run as unprivileged users, who must be able
# to execute the venv's python (an interpreter under /root, e.g. from pyenv, is not).
venv_stamp() { echo "$venv/.hai-install-stamp-$(echo "$1" | tr -c 'a-z' '_')"; }
venv_want() {  # BASE SPEC: what the stamp of SPEC's install says when it is current
    { echo "$repo $1 $2 compat"; cat setup.cfg conf/constraints.txt; cat pyproject.toml 2>/dev/null || true; } \
        | sha256sum | cut -d' ' -f1
}
py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
ensure_venv() {
    local spec=$1 python= candidate base stamp want installed=0 also
    shift
    local covered=("$@")
    if [ -n "${PYTHON:-}" ] && ! py_ok "$PYTHON"; then
        echo "$0: PYTHON=$PYTHON is not a Python >= 3.11" >&2
        exit 1
    fi
    for candidate in ${PYTHON:-} /usr/bin/python3 /usr/bin/python3.11 python3; do
        if py_ok "$candidate"; then python=$candidate; break; fi
    done
    if [ -z "$python" ]; then
        echo "$0: need Python >= 3.11 (set PYTHON=...)" >&2
        exit 1
    fi
    base=$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')
    venv=$repo/.venv
    stamp=$(venv_stamp "$spec")
    if ! py_ok "$venv/bin/python" || [ "$(sed -n 's/^executable = //p' "$venv/pyvenv.cfg" 2>/dev/null)" != "$base" ]; then
        echo "$0: creating $venv with $base" >&2
        rm -rf "$venv"
        "$python" -m venv "$venv"
    fi
    want=$(venv_want "$base" "$spec")
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        echo "$0: installing $spec into $venv" >&2
        # compat: a plain path in a .pth file. The default editable mode installs an import hook
        # that every Python process loads at start (~10 ms: each CLI call, each job's shepherd).
        # -c: the run-time stack the install scripts pin (conf/constraints.txt), so tests run it too.
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -c conf/constraints.txt -e "$spec" \
            --config-settings editable_mode=compat
        echo "$want" > "$stamp"
        for also in "${covered[@]}"; do
            venv_want "$base" "$also" > "$(venv_stamp "$also")"
        done
        installed=1
    fi
    # The C programs (hsubmit, squeue and sacct over pip's Python launchers, hai-jobexec), after an install
    # (which puts the launchers back) or an edit of a source; without a compiler the Python ways stay
    # (docs/OPERATIONS.md).
    if [ $installed = 1 ] || [ "$repo/hai_cluster/native/hsubmit.c" -nt "$venv/bin/hsubmit" ] \
            || [ "$repo/hai_cluster/native/jobexec.c" -nt "$venv/bin/hai-jobexec" ] \
            || [ "$repo/hai_cluster/native/squeue.c" -nt "$venv/bin/squeue" ] \
            || [ "$repo/hai_cluster/native/sacct.c" -nt "$venv/bin/sacct" ] \
            || [ "$repo/hai_cluster/native/client.h" -nt "$venv/bin/squeue" ]; then
        "$venv/bin/python" -m hai_cluster.native.build >&2
    fi
}

# ensure_ml_clients: torch (a CPU build) and Lightning in the venv, for the tests of real ML clients
# (tests/e2e/test_lightning.py, tests/integration/test_examples.py's torch example). The first time
# from a local wheel: ~25 s and ~800 MB (torch is 750 MB of it); after that a version check (~0.2 s).
# Never a CUDA build (GBs of nvidia-* wheels): torch is the CPU wheel in $HAI_TORCH_WHEELS (default
# /opt/wheels, where CI keeps it); without it (PyPI's torch is the CUDA build) nothing is installed
# and those tests skip, with a warning. HAI_TEST_ML=0 skips it too; a failed install only warns.
TORCH_VERSION=2.13.0
LIGHTNING_FABRIC_VERSION=2.6.6
ensure_ml_clients() {
    local tag wheel src
    [ "${HAI_TEST_ML:-1}" = 0 ] && return 0
    if "$venv/bin/python" - "$TORCH_VERSION+cpu" "$LIGHTNING_FABRIC_VERSION" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
sys.exit(not (m.version("torch") == sys.argv[1] and m.version("lightning-fabric") == sys.argv[2]))
PY
    then
        return 0
    fi
    tag=$("$venv/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    wheel=$(ls "${HAI_TORCH_WHEELS:-/opt/wheels}"/torch-"$TORCH_VERSION"+cpu-"$tag"-"$tag"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
        echo "$0: warning: no torch $TORCH_VERSION CPU wheel in ${HAI_TORCH_WHEELS:-/opt/wheels}: the tests of" \
             "real ML clients will skip" >&2
        return 0
    fi
    src=("$wheel")
    echo "$0: installing torch $TORCH_VERSION (CPU) and lightning-fabric $LIGHTNING_FABRIC_VERSION into $venv" >&2
    # torch alone first, from the CPU source only; then Lightning, which finds it installed
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "${src[@]}" \
            || ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
                "torch==$TORCH_VERSION+cpu" "lightning-fabric==$LIGHTNING_FABRIC_VERSION"; then
        echo "$0: warning: torch or lightning-fabric could not be installed; their tests will skip" >&2
    fi
}

# ensure_reachable: jobs and the CLI run as other users, who need to reach the checkout (its
# sources, the venv). Add the traverse bit (not read) to any ancestor directory that lacks it.
ensure_reachable() {
    local d=$repo
    while [ "$d" != "/" ]; do
        case "$(stat -c %A "$d")" in
            *x|*t) ;;
            *) echo "$0: allowing other users to traverse $d (chmod o+x)" >&2
               "${as_root[@]}" chmod o+x "$d" ;;
        esac
        d=$(dirname "$d")
    done
}
