"""The built documentation site, opened in a real browser (headless Chromium driven by Playwright):
pages render, math is typeset, figures load, and every internal link and anchor resolves.

Behind the ``docs`` marker: build the site first (README's docs command), then
``python -m pytest -m docs``. ``.ci/run`` does both. The site folder is ``$PYROBNN_DOCS_HTML``,
else ``docs/_build/html``; Chromium is ``$PYROBNN_CHROMIUM``, else ``/usr/bin/chromium`` (Debian's
package). Either missing skips with the reason, unless ``PYROBNN_REQUIRE_BROWSER=1`` (CI), where
it fails. Screenshots of the landing page and a tutorial go to ``<site>/../screenshots``.
"""

import functools
import html.parser
import http.server
import os
import pathlib
import threading
import urllib.parse

import pytest

pytestmark = pytest.mark.docs

ROOT = pathlib.Path(__file__).resolve().parents[1]
SITE = pathlib.Path(os.environ.get("PYROBNN_DOCS_HTML", ROOT / "docs" / "_build" / "html"))
CHROMIUM = os.environ.get("PYROBNN_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("PYROBNN_REQUIRE_BROWSER") == "1"

# pages a reader reaches first, and one of each kind: math, executed figures, API, tables
PAGES = {
    "index.html": {"figures": False, "math": False},
    "getting-started.html": {"figures": False, "math": True},
    "methods/laplace.html": {"figures": False, "math": True},
    "tutorials/bayes_by_backprop.html": {"figures": True, "math": True},
    "tutorials/classifier.html": {"figures": True, "math": False},
    "results.html": {"figures": False, "math": False},
    "api/mcmc.html": {"figures": False, "math": False},
}


def missing(reason):
    if REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def site():
    if not (SITE / "index.html").is_file():
        missing(f"no built site at {SITE}: build it with README's docs command first")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        missing(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed: pip install -e '.[docs]'")
    with sync_playwright() as p:
        # the flags keep Chromium off the network it would otherwise reach for at start
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic",
        ])
        yield b
        b.close()


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_renders_with_math_and_figures(site, browser, page):
    expect = PAGES[page]
    tab = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    failed = []
    tab.on("requestfailed", lambda r: failed.append(r.url))
    response = tab.goto(site + page, wait_until="networkidle")
    assert response is not None and response.status == 200
    assert tab.locator("article h1").count() >= 1, f"{page}: no heading rendered"
    if expect["math"]:
        tab.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
        tab.evaluate("() => MathJax.startup.promise")
        assert tab.locator("mjx-container").count() > 0, f"{page}: no typeset math"
        assert tab.locator("mjx-merror").count() == 0, f"{page}: MathJax reported a TeX error"
    images = tab.evaluate("() => Array.from(document.images).map(i => [i.src, i.complete && i.naturalWidth > 0])")
    assert all(ok for _, ok in images), f"{page}: images that did not load: {[s for s, ok in images if not ok]}"
    if expect["figures"]:
        assert len(images) > 0, f"{page}: the executed tutorial shows no figure"
    assert not errors, f"{page}: JavaScript errors {errors}"
    assert not failed, f"{page}: requests that failed {failed}"
    tab.close()


def test_screenshots_of_the_landing_page_and_a_tutorial(site, browser):
    out = SITE.parent / "screenshots"
    out.mkdir(exist_ok=True)
    for page, name in [("index.html", "landing.png"), ("tutorials/classifier.html", "tutorial.png")]:
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.goto(site + page, wait_until="networkidle")
        if page.startswith("tutorials"):
            tab.locator("img").first.scroll_into_view_if_needed()
        tab.screenshot(path=str(out / name))
        assert (out / name).stat().st_size > 10_000
        tab.close()


def test_executed_pages_show_no_warning():
    """What a tutorial printed while the site was built is on the page: a warning there is one a
    reader running the same code would see."""
    if not (SITE / "index.html").is_file():
        missing(f"no built site at {SITE}")
    shown = []
    for page in [SITE / "getting-started.html", *sorted((SITE / "tutorials").glob("*.html"))]:
        text = page.read_text(encoding="utf-8")
        for output in text.split('class="cell_output')[1:]:
            chunk = output.split("</div>", 3)[:3]
            if "Warning" in "".join(chunk):
                shown.append(page.name)
    assert not shown, f"warnings in the executed outputs of {sorted(set(shown))}"


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])


@functools.lru_cache(maxsize=None)
def _parsed(path: pathlib.Path):
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_every_internal_link_and_anchor_resolves():
    if not (SITE / "index.html").is_file():
        missing(f"no built site at {SITE}")
    broken = []
    pages = [p for p in SITE.rglob("*.html") if "_modules" not in p.parts and "_sources" not in p.parts]
    for page in pages:
        for href in _parsed(page).links:
            url = urllib.parse.urlparse(href)
            if url.scheme or href.startswith(("mailto:", "//")):
                continue  # external: not followed (no network here)
            target = (page.parent / urllib.parse.unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(SITE)} -> {href}")
            elif url.fragment and target.suffix == ".html" and url.fragment not in _parsed(target).ids:
                broken.append(f"{page.relative_to(SITE)} -> {href} (no such anchor)")
    assert len(pages) > 30
    assert not broken, f"{len(broken)} broken internal links, e.g. {broken[:10]}"
