"""TensorBoard inside Airflow on the real stack: the provider's plugin mounted in the API server,
seen in Chromium by a signed-in user on the DAG run's TensorBoard view, refused without a login,
and the launch task's TensorBoard link pointing at the run's curves."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
import requests

from airflow_tf.plugins.links import run_name

pytestmark = pytest.mark.slow

DAG_ID = "tf_linear_regression"
SMALL_RUN = {"steps": 1500, "rows": 5000}
LAUNCH = "training.launch"


def a_trained_run(stack) -> tuple[str, dict]:
    """A DAG run whose launch trained a group, and the launch's result: the session's earlier run
    of the DAG when there is one (the stack tests before this one make it), else a new one."""
    api = stack.api
    api.wait_for_dag(DAG_ID)
    for run in api.runs(DAG_ID):
        if run["state"] == "success":
            break
    else:
        api.unpause(DAG_ID)
        run_id = api.trigger(DAG_ID, conf=SMALL_RUN)
        run = api.wait_for_run(DAG_ID, run_id, timeout=600)
        assert run["state"] == "success", api.failure_report(DAG_ID, run_id)
    run_id = run["dag_run_id"]
    result = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{LAUNCH}/xcomEntries/return_value",
                      params={"deserialize": "true"})["value"]
    return run_id, result


@pytest.mark.timeout(2400)
def test_signed_in_user_sees_the_runs_loss_curve_in_tensorboard_and_signed_out_is_refused(stack, signed_in_page,
                                                                                          browser):
    url, api = stack.airflow.url, stack.api
    run_id, launch = a_trained_run(stack)
    name = run_name(launch["run_dir"], str(stack.storage / "runs"))
    assert name, f"the run directory {launch['run_dir']} is not below the storage's runs/"

    # Signed out: neither the page nor TensorBoard's data answer.
    assert requests.get(f"{url}/tensorboard/", timeout=60).status_code == 401
    assert requests.get(f"{url}/tensorboard/data/plugin/scalars/tags", timeout=60).status_code == 401
    anonymous = browser.new_context()
    try:
        response = anonymous.new_page().goto(f"{url}/tensorboard/")
        assert response.status == 401, response.status
    finally:
        anonymous.close()

    # With the API's token: TensorBoard's data holds the run's loss.
    tags = api.session.get(f"{url}/tensorboard/data/plugin/scalars/tags", timeout=120)
    assert tags.status_code == 200, tags.text
    assert "loss" in tags.json()[name], tags.json()

    # The launch task's TensorBoard link opens the run's curves.
    links = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{LAUNCH}/links")["extra_links"]
    assert "/tensorboard/?runFilter=" in links["TensorBoard"], links
    assert name in unquote(links["TensorBoard"]).replace("\\", ""), links

    # Signed in, the DAG run's TensorBoard view shows the run's loss curve.
    page = signed_in_page
    screenshot = stack.artifacts / "ui-tensorboard-loss.png"
    screenshot.unlink(missing_ok=True)
    page.goto(f"{url}/dags/{DAG_ID}/runs/{run_id}/plugin/tensorboard")
    board = page.frame_locator("iframe")
    board.get_by_text(name).first.wait_for()
    # The view redirected to TensorBoard filtered to this DAG run's launch.
    [frame] = [f for f in page.frames if "/tensorboard/" in f.url]
    assert "runFilter=" in frame.url and name in unquote(frame.url).replace("\\", ""), frame.url
    # TensorBoard draws only the cards in view: the tag filter brings the loss card to the top.
    tag_filter = board.get_by_role("combobox", name="Filter tags (regex)")
    tag_filter.fill("^loss$")
    tag_filter.press("Escape")  # closes the suggestions over the chart
    card = board.locator("scalar-card-component").filter(has_text="loss").first
    card.locator("line-chart").first.wait_for()
    card.get_by_text(name).first.wait_for()  # the chart's data table: this run's last loss point
    page.wait_for_timeout(2_000)
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
