"""The built documentation site: its links, and the pages in headless Chromium.

Runs on a site built by ``sphinx-build -b html docs DIR`` (scripts/docs_ci.sh
does both); the tests skip when there is none, or, for the browser tests,
when Debian's ``chromium`` is missing, unless ``MPIREDIST_DOCS_REQUIRED=1``
(CI), which makes those failures.  Environment:

- ``MPIREDIST_DOCS_HTML``: the built site (default ``docs/_build/html``);
- ``MPIREDIST_DOCS_ARTIFACTS``: where the screenshots go (default a
  temporary folder; CI gives its log folder);
- ``MPIREDIST_CHROMIUM``: the browser (default ``chromium`` on PATH).

The site is served by ``python -m http.server`` on 127.0.0.1, killed by its
process id when the tests end, failed or not.
"""

import html.parser
import os
import posixpath
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.environ.get("MPIREDIST_DOCS_HTML", os.path.join(ROOT, "docs", "_build", "html"))
REQUIRED = os.environ.get("MPIREDIST_DOCS_REQUIRED", "0") == "1"
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _missing(reason):
    if REQUIRED:
        pytest.fail(reason + " (MPIREDIST_DOCS_REQUIRED=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def site():
    if not os.path.exists(os.path.join(SITE, "index.html")):
        _missing(f"no built site at {SITE} (sphinx-build -b html docs {SITE})")
    return SITE


class _Page(html.parser.HTMLParser):
    """The ids and the links (href, src) of one HTML page."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            if attrs.get(key) and not (tag == "link" and attrs.get("rel") == "preload"):
                self.links.append(attrs[key])


def _pages(root):
    out = {}
    for folder, dirs, files in os.walk(root):
        if folder == root:
            dirs[:] = [d for d in dirs if d not in ("_static", "_sources")]   # theme files
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(folder, name)
                page = _Page()
                with open(path, encoding="utf-8") as f:
                    page.feed(f.read())
                out[os.path.relpath(path, root).replace(os.sep, "/")] = page
    return out


def test_no_internal_link_is_broken(site):
    pages = _pages(site)
    assert len(pages) > 30 and "api/generated/Transfer.html" in pages
    broken, checked = [], 0
    for name, page in pages.items():
        for link in page.links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or url.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = name if not url.path else posixpath.normpath(
                posixpath.join(posixpath.dirname(name), urllib.parse.unquote(url.path)))
            path = os.path.join(site, target)
            if os.path.isdir(path):
                target, path = posixpath.join(target, "index.html"), os.path.join(path, "index.html")
            checked += 1
            if not os.path.exists(path):
                broken.append(f"{name}: {link} (no file {target})")
            elif url.fragment and target in pages and url.fragment not in pages[target].ids:
                broken.append(f"{name}: {link} (no id {url.fragment!r} in {target})")
    assert checked > 500
    assert not broken, "\n".join(broken[:40])


def test_every_public_name_has_an_api_page(site):
    import mpiredist

    missing = [n for n in mpiredist.__all__
               if not os.path.exists(os.path.join(site, "api", "generated", f"{n}.html"))]
    assert not missing
    with open(os.path.join(site, "api", "generated", "Transfer.html"), encoding="utf-8") as f:
        text = f.read()
    assert "workspace_bytes" in text and 'id="mpiredist.Transfer"' in text


# -- in the browser ---------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    path = shutil.which(os.environ.get("MPIREDIST_CHROMIUM", "chromium"))
    if path is None:
        _missing("no chromium (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def server(site):
    """``http://127.0.0.1:PORT/`` serving the site; the server killed at the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1", "--directory", site],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "index.html", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("python -m http.server exited")
                time.sleep(0.1)
        yield url
    finally:
        os.kill(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait()


@pytest.fixture(scope="module")
def artifacts():
    folder = os.environ.get("MPIREDIST_DOCS_ARTIFACTS") or tempfile.mkdtemp(
        prefix="mpiredist-docs-")
    os.makedirs(folder, exist_ok=True)
    return folder


def _chromium(browser, *args, timeout=90):
    """Run the browser with a fresh profile; its CompletedProcess (stdout as text)."""
    with tempfile.TemporaryDirectory(prefix="mpiredist-chromium-") as profile:
        return subprocess.run([browser, *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


def _screenshot(browser, url, path):
    done = _chromium(browser, "--window-size=1280,1000", "--hide-scrollbars",
                     f"--screenshot={path}", url)
    assert os.path.exists(path), f"no screenshot of {url}: {done.stderr[-2000:]}"
    import matplotlib.image
    image = matplotlib.image.imread(path)
    return image


@pytest.mark.parametrize("page, name, text", [
    ("index.html", "docs-home.png", "Redistribute multi-dimensional arrays"),
    ("api/generated/Transfer.html", "docs-api-Transfer.png", "workspace_bytes"),
])
def test_pages_render(browser, server, artifacts, page, name, text):
    pytest.importorskip("matplotlib")
    dom = _chromium(browser, "--virtual-time-budget=5000", "--dump-dom", server + page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert text in dom.stdout                                    # the page's own text
    assert "pydata" in dom.stdout.lower() or "bd-" in dom.stdout  # styled by the theme
    path = os.path.join(artifacts, name)
    image = _screenshot(browser, server + page, path)
    assert image.shape[:2] == (1000, 1280)
    # a rendered page, not a blank one: many distinct colours, dark text on white
    pixels = image[..., :3].reshape(-1, 3)
    assert len({tuple((p * 32).astype(int)) for p in pixels[::97]}) > 20
    assert (pixels.mean(axis=1) < 0.3).mean() > 0.005
    print(f"screenshot of {page}: {path}")


def test_search_finds_a_public_name(browser, server):
    dom = _chromium(browser, "--virtual-time-budget=15000", "--dump-dom",
                    server + "search.html?q=TransferGroup")
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = dom.stdout
    assert 'class="search"' in text, "no results list: searchindex.js did not load"
    assert 'href="api/generated/TransferGroup.html#mpiredist.TransferGroup"' in text
    none = _chromium(browser, "--virtual-time-budget=15000", "--dump-dom",
                     server + "search.html?q=zzzqqqnotaword")
    assert "TransferGroup.html" not in none.stdout
