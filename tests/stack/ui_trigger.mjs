// A user in the Airflow UI: signs in, opens the DAG, triggers it, and watches the run until
// its state badge reads Success or Failed. Saves a screenshot of the finished run and prints
// {"run_id": ..., "state": ...} as the last line. Settings come from the environment:
// AIRFLOW_URL, AIRFLOW_USERNAME, AIRFLOW_PASSWORD, DAG_ID, SCREENSHOT, RUN_TIMEOUT_SECONDS,
// PARAMS (JSON object: values typed into the dialog's Run Parameters form, by param name),
// CHROMIUM (default /usr/bin/chromium, Debian's package).
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { chromium } = require('playwright-core');

const env = (name, fallback) => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`environment variable ${name} is required`);
  return value;
};
const base = env('AIRFLOW_URL');
const dagId = env('DAG_ID');
const screenshot = env('SCREENSHOT');
const runTimeout = Number(env('RUN_TIMEOUT_SECONDS', '300')) * 1000;
const params = JSON.parse(env('PARAMS', '{}'));

const browser = await chromium.launch({
  executablePath: env('CHROMIUM', '/usr/bin/chromium'),
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
page.setDefaultTimeout(60_000);
try {
  // Signing in: the simple auth manager's login form.
  await page.goto(`${base}/dags/${dagId}`);
  await page.getByLabel('Username').fill(env('AIRFLOW_USERNAME'));
  await page.getByLabel('Password').fill(env('AIRFLOW_PASSWORD'));
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL((url) => url.pathname === `/dags/${dagId}`);

  // Triggering: the DAG page's Trigger button, the dialog's Run Parameters form, then the
  // dialog's own Trigger button (a single run).
  await page.getByRole('button', { name: 'Trigger Dag' }).click();
  const dialog = page.getByRole('dialog');
  for (const [name, value] of Object.entries(params)) {
    await dialog.getByLabel(name, { exact: true }).fill(String(value));
  }
  await dialog.getByRole('button', { name: 'Trigger', exact: true }).click();
  await page.waitForURL((url) => url.pathname.startsWith(`/dags/${dagId}/runs/`));
  const runId = decodeURIComponent(new URL(page.url()).pathname.split('/runs/')[1]);

  // Watching: the run page's header badge; reload now and then in case polling stalls.
  const badge = page.getByTestId('header-card').getByTestId('state-badge');
  const deadline = Date.now() + runTimeout;
  let state = '';
  let reloaded = Date.now();
  while (Date.now() < deadline) {
    state = (await badge.innerText({ timeout: 10_000 }).catch(() => '')).trim();
    if (state === 'Success' || state === 'Failed') break;
    await page.waitForTimeout(2_000);
    if (Date.now() - reloaded > 30_000) {
      await page.reload();
      reloaded = Date.now();
    }
  }
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ run_id: runId, state }));
} catch (error) {
  await page.screenshot({ path: screenshot.replace(/\.png$/, '-error.png') }).catch(() => {});
  throw error;
} finally {
  await browser.close();
}
