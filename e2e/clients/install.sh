#!/usr/bin/env bash
# Installs the official TypeScript and Python MCP SDK clients that
# e2e/sdk_test.go drives (and the TypeScript SDK's servers that
# e2e/reference_test.go and e2e/rev2026_test.go run), at the versions
# pinned beside this script, and capsnap's envelope verifiers for those
# SDKs (verifiers/), at theirs:
#
#   e2e/clients/ts/node_modules  npm ci from ts/package-lock.json
#   verifiers/ts/node_modules    npm ci from verifiers/ts/package-lock.json
#   bin/sdk-venv                 a venv with python/requirements.txt and
#                                verifiers/python/requirements.txt,
#                                constrained by python/constraints.txt
#
# Idempotent and quick when nothing changed: each half is redone only when
# it is missing or its pinned files changed (a stamp holds their digest).
# Prints the Node, Python and SDK versions. A missing node, npm or python3
# is an error, never a skip: the tests then fail too.
#
# Environment: SDK_VENV overrides the venv's directory (default bin/sdk-venv
# under the repository); NODE and PYTHON3 name the interpreters to use
# (default node and python3 on PATH).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
ts="$here/ts"
py="$here/python"
venv="${SDK_VENV:-$root/bin/sdk-venv}"
node="${NODE:-node}"
python3="${PYTHON3:-python3}"

die() {
	echo "e2e/clients/install.sh: $*" >&2
	exit 1
}

digest() {
	if command -v sha256sum >/dev/null 2>&1; then
		cat "$@" | sha256sum | cut -d' ' -f1
	else
		cat "$@" | shasum -a 256 | cut -d' ' -f1
	fi
}

# --- TypeScript: @modelcontextprotocol/sdk ---------------------------------
command -v "$node" >/dev/null 2>&1 ||
	die "node not found: the TypeScript MCP SDK client needs Node.js 20 or later (your package manager's nodejs and npm)"
command -v npm >/dev/null 2>&1 ||
	die "npm not found: it installs the TypeScript MCP SDK client; install it with Node.js 20 or later"
node_major="$("$node" -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "node $("$node" --version) is too old: the TypeScript MCP SDK client needs Node.js 20 or later"

for dir in "$ts" "$root/verifiers/ts"; do
	stamp="$dir/node_modules/.capsnap-install"
	want="$(digest "$dir/package.json" "$dir/package-lock.json")-$("$node" --version)"
	if [ ! -d "$dir/node_modules" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
		echo "installing ${dir#"$root"/} (npm ci)"
		npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error ||
			die "npm ci --prefix $dir failed"
		echo "$want" >"$stamp"
	fi
done

# --- Python: mcp ---------------------------------------------------------
# The envelope verifier's JOSE library, joserfc, needs Python 3.11.
pyreq="$root/verifiers/python/requirements.txt"
command -v "$python3" >/dev/null 2>&1 ||
	die "python3 not found: the Python MCP SDK client and envelope verifier need Python 3.11 or later, with its venv module"
"$python3" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
	die "$("$python3" --version 2>&1) is too old: the Python MCP SDK client and envelope verifier need Python 3.11 or later"

py_stamp="$venv/.capsnap-install"
py_want="$(digest "$py/requirements.txt" "$py/constraints.txt" "$pyreq")-$("$python3" -c 'import sys; print(sys.version.split()[0])')"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$py_stamp" 2>/dev/null)" != "$py_want" ]; then
	echo "installing the Python MCP SDK client (a venv at ${venv#"$root"/})"
	rm -rf "$venv"
	mkdir -p "$(dirname "$venv")"
	"$python3" -m venv "$venv" ||
		die "$python3 -m venv $venv failed: install Python's venv module (on Debian and Ubuntu: apt-get install python3-venv)"
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
		-r "$py/requirements.txt" -r "$pyreq" -c "$py/constraints.txt" ||
		die "pip install -r $py/requirements.txt -r $pyreq -c $py/constraints.txt failed"
	echo "$py_want" >"$py_stamp"
fi

# --- What the tests will run -----------------------------------------------
ts_sdk="$(cd "$ts" && "$node" -p 'require("./node_modules/@modelcontextprotocol/sdk/package.json").version')" ||
	die "the TypeScript MCP SDK is not importable from $ts"
ts_server="$(cd "$ts" && "$node" -p 'require("./node_modules/@modelcontextprotocol/server/package.json").version')" ||
	die "the TypeScript MCP SDK's 2.x server package is not installed in $ts"
py_sdk="$("$venv/bin/python" -c 'from importlib.metadata import version; import mcp; print(version("mcp"))')" ||
	die "the Python MCP SDK is not importable in $venv"
ver_ts="$(cd "$root/verifiers/ts" && "$node" -p 'const v = p => require("./node_modules/" + p + "/package.json").version; `jose ${v("jose")}, canonicalize ${v("canonicalize")}, @modelcontextprotocol/sdk ${v("@modelcontextprotocol/sdk")}`')" ||
	die "the TypeScript envelope verifier's packages are not installed in verifiers/ts"
ver_py="$("$venv/bin/python" -c 'from importlib.metadata import version; import joserfc, rfc8785; print("joserfc", version("joserfc") + ", rfc8785", version("rfc8785"))')" ||
	die "the Python envelope verifier's packages are not importable in $venv"
echo "node $("$node" --version): @modelcontextprotocol/sdk $ts_sdk, @modelcontextprotocol/server $ts_server (CAPSNAP_E2E_NODE=$(command -v "$node"))"
echo "$("$venv/bin/python" --version): mcp $py_sdk (CAPSNAP_E2E_PYTHON=$venv/bin/python)"
echo "envelope verifiers: verifiers/ts ($ver_ts); verifiers/python ($ver_py)"
if command -v go >/dev/null 2>&1; then
	echo "go $(go env GOVERSION): $(cd "$root" && go list -m -f '{{.Path}} {{.Version}}' github.com/modelcontextprotocol/go-sdk)"
fi
