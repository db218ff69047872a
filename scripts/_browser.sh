# Sourced by scripts/test: Debian's Chromium and its chromedriver (one source package, so their
# versions always match) for the fit table's browser tests (tests/e2e/test_fit_table.py).
# Installed quietly with apt-get when missing, if this is root with apt-get (as CI is); otherwise
# those tests skip and say why. The install's output: /tmp/vrambudget-browser-install.log.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver for the browser tests ..." >&2
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
        >/tmp/vrambudget-browser-install.log 2>&1; then
      echo "could not install chromium (see /tmp/vrambudget-browser-install.log):" \
        "the browser tests will fail" >&2
    fi
  fi
fi
