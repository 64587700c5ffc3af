"""The report in a real headless browser: it loads without console errors, the pictures
render, hovering shows a node's details. A screenshot is kept in the artifacts folder.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/install-browser``) and selenium.
Skipped where they are missing, except in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
from _html_helpers import tiny_gm

import fxpass as fp
from fxpass.html import HtmlReport
from fxpass.verify import NumericsCheck

pytestmark = pytest.mark.browser

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    missing = [
        what
        for what, ok in (
            ("chromium", CHROMIUM),
            ("chromedriver (Debian: chromium-driver)", DRIVER),
            ("selenium", importlib.util.find_spec("selenium")),
        )
        if not ok
    ]
    if missing:
        message = f"headless browser test needs {', '.join(missing)}; run .ci/install-browser"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,1100"):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def test_report_renders_in_chromium(browser, tmp_path, artifacts_dir):
    gm = tiny_gm()
    check = NumericsCheck()
    path = tmp_path / "report.html"
    report = HtmlReport(path, numerics=check, info={"target": "tiny decoder"})
    fp.Pipeline.parse("cse,planted_passes:add_as_sub_neg,dce").run(gm, instrument=[check, report])
    shutil.copy(path, artifacts_dir / "report.html")
    browser.get(path.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
    pictures = browser.execute_script(
        """return Array.from(document.querySelectorAll('svg.graph')).map(function (s) {
             var r = s.getBoundingClientRect();
             var n = s.querySelectorAll('g.node');
             var box = n.length ? n[0].getBBox() : {width: 0, height: 0};
             return [r.width, r.height, n.length, box.width, box.height,
                     s.querySelectorAll('path.edge').length];
           });"""
    )
    drawn = sum(2 for c in report.changes for h in c.hunks if h.before.nodes and h.after.nodes)
    assert len(pictures) == drawn >= 4
    for width, height, nodes, node_w, node_h, _edges in pictures:
        assert width > 50 and height > 30 and nodes > 0 and node_w > 20 and node_h > 10
    assert sum(p[5] for p in pictures) > 0  # edges are drawn
    shown = browser.execute_script(
        """var g = document.querySelector('#change-1 g.node.rewired');
           g.scrollIntoView({block: 'center'});
           g.dispatchEvent(new MouseEvent('mouseenter'));
           return [g.getAttribute('data-id'), document.getElementById('panel-body').innerText,
                   document.querySelectorAll('g.node.peer').length];"""
    )
    node_id, panel, peers = shown
    assert node_id.split(":", 1)[1] in panel and "rewired" in panel
    assert peers >= 1  # the same node is lit in the other picture
    assert browser.execute_script("return document.title").startswith("fxpass report")
    browser.save_screenshot(str(artifacts_dir / "report.png"))
    assert (artifacts_dir / "report.png").stat().st_size > 10_000


def test_a_whole_region_fits_without_scrolling_and_the_panel_folds(
    browser, tmp_path, artifacts_dir
):
    """Pictures fit the page's width (a wide region goes full width, before above after), no
    pane scrolls, and the node panel folds away to give the pictures its room."""
    path = tmp_path / "wide.html"
    report = HtmlReport(path, info={"target": "tiny decoder"})
    fp.Pipeline.parse("remove_assert_ops,remove_noop,fuse_add_rmsnorm").run(
        tiny_gm(), instrument=[report]
    )
    browser.set_window_size(1500, 1100)
    browser.get(path.as_uri())
    measure = """return Array.from(document.querySelectorAll('svg.graph')).map(function (s) {
        var pane = s.closest('.side');
        return {natural: Number(s.getAttribute('data-width')),
                width: s.getBoundingClientRect().width, pane: pane.clientWidth,
                scrolls: pane.scrollWidth > pane.clientWidth + 1
                         || pane.scrollHeight > pane.clientHeight + 1,
                stacked: pane.parentElement.classList.contains('stacked')};
      });"""
    pictures = browser.execute_script(measure)
    assert pictures and not any(p["scrolls"] for p in pictures)
    for p in pictures:  # fit to the pane's width, never blown up past the drawn size
        assert abs(p["width"] - min(p["natural"], p["pane"])) <= 2, p
    wide = [p for p in pictures if p["stacked"]]
    assert wide and all(p["natural"] > p["pane"] / 2 for p in wide)
    browser.execute_script("document.querySelector('.stacked').scrollIntoView()")
    browser.save_screenshot(str(artifacts_dir / "report-wide.png"))
    zoomed = """var side = document.querySelector('.stacked .side');
        side.querySelector('button.zoom').click();
        var svg = side.querySelector('svg.graph');
        return [svg.getBoundingClientRect().width, Number(svg.getAttribute('data-width'))];"""
    shown, natural = browser.execute_script(zoomed)  # "actual size": as drawn
    assert abs(shown - natural) <= 2
    browser.execute_script(zoomed)  # and back to fit
    main_width = "return document.querySelector('main').clientWidth"
    before = browser.execute_script(main_width)
    browser.find_element("id", "panel-toggle").click()
    browser.execute_script("return new Promise(function (r) { setTimeout(r, 300); })")
    assert browser.execute_script("return document.body.classList.contains('panel-closed')")
    assert browser.execute_script(main_width) > before + 200
    assert not any(p["scrolls"] for p in browser.execute_script(measure))
    browser.save_screenshot(str(artifacts_dir / "report-wide-panel-folded.png"))
    node = browser.find_element("css selector", "g.node.changed, g.node.new")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", node)
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click'))", node)
    assert not browser.execute_script("return document.body.classList.contains('panel-closed')")
    assert (
        node.get_attribute("data-id").split(":", 1)[1]
        in browser.find_element("id", "panel-body").text
    )
