"""The executor page and the dashboard card in a real browser, on a real Airflow, while a DAG runs.

Headless Chromium from Debian's packages (/usr/bin/chromium, installed by `make install-browser`),
driven by Playwright, which is told to use that binary (it downloads no browser). The test logs in
through Airflow's own login form, finds the health card on the home dashboard, opens the "Executor"
entry of the navigation and reads the page Airflow frames there: the verdict, and a row per running
task; then it pauses the executor with the page's button (a cancelled confirmation changes nothing, a
confirmed one pauses), tries a resize to a limit that is not one, and resumes it. The screenshots it takes go to $ALE_SCREENSHOTS when set (`make screenshots` refreshes the ones in
docs/images), else beside the test's other files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import FloatRect, expect, sync_playwright

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import SWITCH_TASKS, open_the_gate, poll

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox(users={"admin": "admin"})]

CHROMIUM = Path("/usr/bin/chromium")
# As root, without a display or a network: no sandbox, no GPU, and none of the background requests
# Chromium makes at start (this machine refuses them, many at a time).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOME_TOP: FloatRect = {"x": 0, "y": 0, "width": 1400, "height": 440}
# A guard on each wait for the page, never a pause: on actions and on assertions alike. Playwright's
# assertions give up after 5 s by default, and on a busy host the home page can take longer than that to
# load the card's bundle from the api-server (the card was missing from a page rendered without it).
GUARD_MS = 60_000
expect.set_options(timeout=GUARD_MS)


def test_the_executor_page_shows_the_verdict_and_the_running_tasks(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    assert CHROMIUM.exists(), "Debian's chromium is missing: run `make install-browser`"
    shots = Path(os.environ.get("ALE_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    run_id = sandbox.trigger("switch")
    poll("the tasks at the gate", lambda: len(list(tmp_path.glob("started.*"))) == SWITCH_TASKS)

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for scheme in ("light", "dark"):
                context = browser.new_context(viewport={"width": 1400, "height": 900}, color_scheme=scheme)
                page = context.new_page()
                page.set_default_timeout(GUARD_MS)

                # Airflow's own login form.
                page.goto(f"{sandbox.api_url}/")
                page.wait_for_url("**/auth/login**")
                page.locator("input[name=username]").fill("admin")
                page.locator("input[name=password]").fill(sandbox.passwords["admin"])
                page.locator("button[type=submit]").click()
                page.wait_for_url(lambda url: "/auth/" not in url)

                # The card on the home dashboard.
                expect(page.get_by_test_id("async-local-executor-card-verdict")).to_have_text("healthy")
                if scheme == "light":  # the top of the home page: the navigation and the card
                    page.screenshot(path=shots / "dashboard-card.png", clip=HOME_TOP)

                # The navigation entry, and the page Airflow frames for it.
                page.get_by_test_id("nav-sidebar").get_by_role("link", name="Executor", exact=True).click()
                page.wait_for_url("**/plugin/async-local-executor")
                frame = page.frame_locator("iframe")
                expect(frame.get_by_test_id("verdict")).to_have_text("healthy")
                running = frame.get_by_test_id("running").locator("tbody tr")
                expect(running).to_have_count(SWITCH_TASKS)
                expect(running.filter(has_text="switch.hold[0]")).to_have_count(1)
                first = running.filter(has_text="switch.hold[0]").locator("td")
                expect(first.nth(1)).to_have_text("1")  # its try
                page.screenshot(path=shots / f"executor-page-{scheme}.png")
                if scheme == "light":
                    # Live control from the page: each button asks first; the page then shows who paused.
                    expect(frame.get_by_test_id("control-state")).to_have_text("running")
                    frame.get_by_test_id("pause").click()
                    expect(frame.get_by_test_id("confirm")).to_contain_text(
                        "Pause the executor of scheduler pid"
                    )
                    frame.get_by_test_id("confirm-no").click()
                    expect(frame.get_by_test_id("confirm")).to_be_hidden()
                    expect(frame.get_by_test_id("control-state")).to_have_text("running")
                    frame.get_by_test_id("pause").click()
                    frame.get_by_test_id("confirm-yes").click()
                    expect(frame.get_by_test_id("control-result")).to_contain_text(
                        "pause: applied: paused by admin at"
                    )
                    expect(frame.get_by_test_id("control-state")).to_contain_text("paused by admin at")
                    expect(frame.get_by_test_id("pause")).to_be_disabled()
                    # A resize asks for the new limit, and refuses one that is not a whole number.
                    frame.get_by_test_id("resize").click()
                    frame.get_by_test_id("confirm-input").fill("2.5")
                    frame.get_by_test_id("confirm-yes").click()
                    expect(frame.get_by_test_id("confirm")).to_contain_text("Parallelism is a whole number")
                    frame.get_by_test_id("confirm-no").click()
                    frame.get_by_test_id("resume").click()
                    frame.get_by_test_id("confirm-yes").click()
                    expect(frame.get_by_test_id("control-state")).to_contain_text("running by admin at")
                context.close()
        finally:
            browser.close()

    tries, _ = open_the_gate(sandbox, tmp_path, run_id)
    assert tries == [("success", 1)] * SWITCH_TASKS
