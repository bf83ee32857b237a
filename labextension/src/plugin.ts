// The application plugin: saved event logs (.arrow) and traces of other tools (TRACE_EXTENSIONS)
// open as results. The Jupyter server's
// gpuviz extension (gpuviz_labextension/handlers.py) analyses the file where it lies and
// answers with the result JSON; this file only wires that to a ResultView.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { ABCWidgetFactory, DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { ServerConnection } from '@jupyterlab/services';

import { LOG_EXTENSION, RESULT_ROUTE, TRACE_EXTENSIONS } from './format';
import { ResultView } from './renderer';

const FILE_TYPE = 'gpuviz-log';
const TRACE_TYPE = 'gpuviz-trace';
const FACTORY = 'gpuviz log';

/** Ask the server for the result of the event log at ``path`` (relative to its root). */
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

class LogView extends ResultView {
  constructor(context: DocumentRegistry.Context) {
    super();
    void this._load(context.path); // no need to wait for the browser's copy of the file
  }

  private async _load(path: string): Promise<void> {
    try {
      await this.showResult(await fetchResult(path));
    } catch (error) {
      this.showError(String((error as Error).message ?? error));
    }
  }
}

class LogViewFactory extends ABCWidgetFactory<DocumentWidget<LogView>> {
  protected createNewWidget(context: DocumentRegistry.Context): DocumentWidget<LogView> {
    return new DocumentWidget({ content: new LogView(context), context });
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuviz-labextension:event-log',
  description: 'Opens gpuviz event logs (.arrow) and the traces gpuviz reads (.xplane.pb, ...) as results.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addFileType({
      name: FILE_TYPE,
      displayName: 'gpuviz event log',
      extensions: [LOG_EXTENSION],
      mimeTypes: ['application/vnd.apache.arrow.stream'],
      contentType: 'file',
      fileFormat: 'base64'
    });
    app.docRegistry.addFileType({
      name: TRACE_TYPE,
      displayName: 'trace gpuviz opens',
      extensions: TRACE_EXTENSIONS,
      contentType: 'file',
      fileFormat: 'base64'
    });
    app.docRegistry.addWidgetFactory(
      new LogViewFactory({
        name: FACTORY,
        label: 'gpuviz result',
        modelName: 'base64',
        fileTypes: [FILE_TYPE, TRACE_TYPE],
        defaultFor: [FILE_TYPE, TRACE_TYPE],
        readOnly: true
      })
    );
  }
};

export default plugin;
