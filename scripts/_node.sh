# Sourced by scripts/test (after _venv.sh): the Node tools the tests use to build and compile the
# TypeScript client (tests/clients/package.json, exact versions in its package-lock.json),
# installed once with `npm ci`. Without node and npm the client test skips and says so.
if [ ! -d tests/clients/node_modules ]; then
  if command -v npm > /dev/null; then
    (cd tests/clients && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "scripts/_node.sh: npm not found; the TypeScript client test will be skipped" >&2
  fi
fi
