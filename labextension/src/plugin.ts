// The application plugin: saved event logs (.arrow), traces of other tools (TRACE_EXTENSIONS:
// PyTorch memory snapshots, XPlane, XProf memory profiles) and run manifests (RUN_EXTENSION:
// a distributed run's heatmaps and per-rank table) open as results. The Jupyter
// server's gpuviz extension (gpuviz/frontends/labserver.py) analyses the file where it lies
// and answers with the result JSON; this file only wires that to a ResultView.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  ABCWidgetFactory,
  DocumentRegistry,
  DocumentWidget,
  TextModelFactory
} from '@jupyterlab/docregistry';
import { Contents } from '@jupyterlab/services';

import { LOG_EXTENSION, RUN_EXTENSION, TRACE_EXTENSIONS } from './format';
import { ResultView } from './renderer';
import { fetchResult } from './server';

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
  },
  {
    name: 'gpuviz-run',
    displayName: 'gpuviz distributed run',
    extensions: [RUN_EXTENSION]
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
  description:
    'Opens gpuviz event logs (.arrow), the traces gpuviz reads (.pickle, .xplane.pb, ...) and runs (.gpuviz-run) as results.',
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
