// The Jupyter server's gpuviz route (gpuviz/frontends/labserver.py): the result of a file
// that lies on the server (an event log, a trace, a run manifest), analysed where it lies.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { RESULT_ROUTE } from './format';

/** Ask the server for the result of the file at ``path`` (relative to its root). */
export async function fetchResult(path: string): Promise<unknown> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, ...RESULT_ROUTE) + '?path=' + encodeURIComponent(path);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (body as { message?: string }).message || response.statusText;
    throw new Error(`${path}: ${message} (HTTP ${response.status})`);
  }
  return body;
}
