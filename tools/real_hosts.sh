#!/usr/bin/env bash
# Sets up the real hosts the opt-in real suites run against (tests/comfyui, tests/forge), on a
# CPU machine, from snapshots the `fetch` tool brought (bare git dirs, /work/.mirror/<owner>+<name>/repo):
#
#   bash tools/real_hosts.sh [HOST ...] [NAME=GITDIR ...]
#
# HOST is one or more of (default: all, in this order):
#   v0.33.0  yzkee/ComfyUI (ComfyUI 0.33.0, dynamic VRAM)       -> $FERRY_HOSTS/comfy/v0.33.0
#   forge    lllyasviel/stable-diffusion-webui-forge, with lllyasviel/huggingface_guess and
#            AUTOMATIC1111/stable-diffusion-webui-assets in repositories/   -> $FERRY_HOSTS/forge
#   v0.3.64  Comfy-Org/ComfyUI (ComfyUI 0.3.64)                  -> $FERRY_HOSTS/comfy/v0.3.64
#   gguf     city96/ComfyUI-GGUF (a pack; no venv of its own)   -> $FERRY_HOSTS/comfy/ComfyUI-GGUF
#   v0.8.0   pollockjj/ComfyUI (ComfyUI 0.8.0)                   -> $FERRY_HOSTS/comfy/v0.8.0
# NAME=GITDIR overrides where a snapshot's git dir is (NAME: one of the HOSTs above, or
# huggingface_guess / webui-assets); by default it is $FERRY_MIRROR/<owner>+<name>/repo
# (FERRY_MIRROR default /work/.mirror, FERRY_HOSTS default /work).
#
# Each ComfyUI core gets <core>/venv (what tests/comfyui/conftest.py and run_cores.sh run the server
# on): torch==2.13.0 first (the CPU wheel on this machine's disk), then the core's requirements.txt
# minus torch/torchvision/torchaudio/spandrel under constraints.txt (torch==2.13.0), plus requests,
# gguf==0.19.0 (ComfyUI-GGUF) and torchao==0.18.0. Forge gets <forge>/venv (tests/forge/forge_server.py):
# torch==2.13.0, then requirements_versions.txt without torch and without its setuptools pin (it
# conflicts with torch 2.13), plus setuptools<81 (pytorch_lightning needs pkg_resources) and joblib.
# torchvision/torchaudio are not installed: the suites put tests/comfyui/site or tests/forge/site
# (sitecustomize stand-ins) on PYTHONPATH. See docs/real-hosts.md and
# /work/shared/notes/facts.md ("ComfyUI", "Checked 2026-11-22/23/25").
#
# Re-runnable: a checkout that exists is extracted again over itself (same files), a venv that exists
# is reused (pip skips what is installed). The hosts are set up in parallel, in the background,
# each logging to $FERRY_HOSTS/<host>.setup.log; the script waits for all and prints one line per host.
# The checkouts are extracted blob by blob (`git archive` refuses a tree with a missing blob); a
# missing blob is named in the log and skipped.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mirror=${FERRY_MIRROR:-/work/.mirror}
hosts_root=${FERRY_HOSTS:-/work}
constraints=$repo/constraints.txt
declare -A gitdir=(
  [v0.33.0]=$mirror/yzkee+ComfyUI/repo
  [forge]=$mirror/lllyasviel+stable-diffusion-webui-forge/repo
  [huggingface_guess]=$mirror/lllyasviel+huggingface_guess/repo
  [webui-assets]=$mirror/AUTOMATIC1111+stable-diffusion-webui-assets/repo
  [v0.3.64]=$mirror/Comfy-Org+ComfyUI/repo
  [gguf]=$mirror/city96+ComfyUI-GGUF/repo
  [v0.8.0]=$mirror/pollockjj+ComfyUI/repo
)
all=(v0.33.0 forge v0.3.64 gguf v0.8.0)
wanted=()
for arg in "$@"; do
  case $arg in
    *=*) name=${arg%%=*}
         [ -n "${gitdir[$name]+x}" ] || { echo "real_hosts: unknown snapshot '$name' (one of: ${!gitdir[*]})" >&2; exit 2; }
         gitdir[$name]=${arg#*=} ;;
    v0.33.0|forge|v0.3.64|gguf|v0.8.0) wanted+=("$arg") ;;
    *) echo "real_hosts: unknown host '$arg' (one of: ${all[*]}, or NAME=GITDIR)" >&2; exit 2 ;;
  esac
done
[ ${#wanted[@]} -eq 0 ] && wanted=("${all[@]}")

extract() {  # extract GITDIR DEST: the tree at GITDIR's HEAD into DEST, blob by blob
  local src=$1 dest=$2
  git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null \
    || { echo "real_hosts: $src is not a git dir with a HEAD (fetch the repository first)"; return 1; }
  mkdir -p "$dest"
  python3 - "$src" "$dest" <<'PY'
import os, subprocess, sys
src, dest = sys.argv[1], sys.argv[2]
git = ["git", f"--git-dir={src}"]
entries = []
for rec in subprocess.run(git + ["ls-tree", "-r", "-z", "HEAD"], capture_output=True, check=True).stdout.split(b"\0"):
    if rec:
        meta, path = rec.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob":  # submodules (commit) are not part of the snapshot
            entries.append((mode.decode(), sha.decode(), os.fsdecode(path)))
cat = subprocess.Popen(git + ["cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
missing = 0
for mode, sha, path in entries:
    cat.stdin.write(sha.encode() + b"\n"); cat.stdin.flush()
    header = cat.stdout.readline().split()
    if header[-1] == b"missing":
        print(f"real_hosts: missing blob {sha} for {path}: skipped"); missing += 1; continue
    data = cat.stdout.read(int(header[2])); cat.stdout.read(1)
    out = os.path.join(dest, path)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if os.path.lexists(out) and (mode == "120000" or os.path.islink(out)):
        os.unlink(out)
    if mode == "120000":
        os.symlink(os.fsdecode(data), out)
        continue
    with open(out, "wb") as f:
        f.write(data)
    os.chmod(out, 0o755 if mode == "100755" else 0o644)
cat.stdin.close(); cat.wait()
head = subprocess.run(git + ["log", "-1", "--format=%H %ci", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"real_hosts: extracted {len(entries) - missing} files ({missing} missing) of {src} at {head} into {dest}")
PY
}

pip_venv() {  # pip_venv DIR: DIR/venv with torch==2.13.0 (first, alone: the CPU wheel on disk)
  [ -x "$1/venv/bin/python" ] || python3 -m venv "$1/venv" || return 1
  "$1/venv/bin/python" -m pip install -q torch==2.13.0
}

setup_core() {  # setup_core HOST: a ComfyUI core and its venv
  local dest=$hosts_root/comfy/$1
  extract "${gitdir[$1]}" "$dest" || return 1
  pip_venv "$dest" || return 1
  grep -viE '^\s*(torch|torchvision|torchaudio|spandrel)\s*([<>=!~;[].*)?$' "$dest/requirements.txt" \
    > "$dest/venv/requirements-ferry.txt"
  "$dest/venv/bin/python" -m pip install -q -c "$constraints" -r "$dest/venv/requirements-ferry.txt" \
    requests gguf==0.19.0 torchao==0.18.0
}

setup_gguf() {  # ComfyUI-GGUF is a pack: the cores' venvs carry its one dependency (gguf)
  extract "${gitdir[gguf]}" "$hosts_root/comfy/ComfyUI-GGUF"
}

setup_forge() {
  local dest=$hosts_root/forge
  extract "${gitdir[forge]}" "$dest" || return 1
  extract "${gitdir[huggingface_guess]}" "$dest/repositories/huggingface_guess" || return 1
  extract "${gitdir[webui-assets]}" "$dest/repositories/stable-diffusion-webui-assets" || return 1
  pip_venv "$dest" || return 1
  grep -viE '^\s*(torch|setuptools)\s*([<>=!~;[].*)?$' "$dest/requirements_versions.txt" \
    > "$dest/venv/requirements-ferry.txt"
  "$dest/venv/bin/python" -m pip install -q -c "$constraints" -r "$dest/venv/requirements-ferry.txt" \
    "setuptools<81" joblib
}

declare -A pids=()
for host in "${wanted[@]}"; do
  log=$hosts_root/$host.setup.log
  mkdir -p "$hosts_root"
  case $host in
    forge) setup_forge >"$log" 2>&1 & ;;
    gguf) setup_gguf >"$log" 2>&1 & ;;
    *) setup_core "$host" >"$log" 2>&1 & ;;
  esac
  pids[$host]=$!
  echo "real_hosts: $host: setting up (log: $log)"
done
status=0
for host in "${wanted[@]}"; do
  if wait "${pids[$host]}"; then echo "real_hosts: $host: ready"
  else echo "real_hosts: $host: FAILED (see $hosts_root/$host.setup.log)"; status=1
  fi
done
exit "$status"
