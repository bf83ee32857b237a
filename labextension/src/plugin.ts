// The application plugin: saved event logs (.arrow) and traces of other tools (TRACE_EXTENSIONS:
// PyTorch memory snapshots, XPlane, XProf memory profiles) open as results. The Jupyter
// server's gpuviz extension (gpuviz_labextension/handlers.py) analyses the file where it lies
// and answers with the result JSON; this file only wires that to a ResultView.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import {
  ABCWidgetFactory,
  DocumentRegistry,
  DocumentWidget,
  TextModelFactory
} from '@jupyterlab/docregistry';
import { Contents, ServerConnection } from '@jupyterlab/services';

import { LOG_EXTENSION, RESULT_ROUTE, TRACE_EXTENSIONS } from './format';
import { ResultView } from './renderer';

const FACTORY = 'gpuviz log';
const MODEL = 'gpuviz-no-content';

/** The file types that open as results: binary files the browser never needs to read. */
const FILE_TYPES: Partial<DocumentRegistry.IFileType>[] = [
  {
    name: 'gpuviz-log',
    displayName: 'gpuviz event log',
    extensions: [LOG_EXTENSION],
    mimeTypes: ['application/vnd.apache.arrow.stream']
  },
  {
    name: 'gpuviz-trace',
    displayName: 'trace gpuviz opens',
    extensions: TRACE_EXTENSIONS
  }
];

/**
 * A model factory whose documents load no content: with a null file format the document
 * context asks the server for the file's metadata only, so opening a log of any size
 * downloads nothing to the browser and decodes nothing as text (the server reads it).
 */
class NoContentModelFactory extends TextModelFactory {
  get name(): string {
    return MODEL;
  }

  get fileFormat(): Contents.FileFormat {
    return null;
  }
}

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
  description: 'Opens gpuviz event logs (.arrow) and the traces gpuviz reads (.pickle, .xplane.pb, ...) as results.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    for (const fileType of FILE_TYPES) {
      app.docRegistry.addFileType({ ...fileType, contentType: 'file', fileFormat: 'base64' });
    }
    app.docRegistry.addModelFactory(new NoContentModelFactory());
    const names = FILE_TYPES.map(fileType => fileType.name as string);
    app.docRegistry.addWidgetFactory(
      new LogViewFactory({
        name: FACTORY,
        label: 'gpuviz result',
        modelName: MODEL,
        fileTypes: names,
        defaultFor: names,
        readOnly: true
      })
    );
  }
};

export default plugin;
