// The mime renderer: draws a gpuviz result (summary, plotly figures, tables) in
// notebook outputs and opens .gpuviz.json files. This file only wires; the format is
// in format.ts.
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { FILE_EXTENSION, IResult, MIME_TYPE, parseResult } from './format';

const CLASS_NAME = 'jp-gpuviz-result';

function heading(text: string): HTMLElement {
  const h = document.createElement('h3');
  h.textContent = text;
  return h;
}

function table(columns: string[], rows: (string | number | null)[][]): HTMLTableElement {
  const node = document.createElement('table');
  const head = node.createTHead().insertRow();
  for (const column of columns) {
    const th = document.createElement('th');
    th.textContent = column;
    head.appendChild(th);
  }
  const body = node.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const value of row) {
      tr.insertCell().textContent = value === null ? '' : String(value);
    }
  }
  return node;
}

export class ResultRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass(CLASS_NAME);
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const parsed = parseResult(model.data[this._mimeType]);
    this._purge();
    this.node.textContent = '';
    if (typeof parsed === 'string') {
      const error = document.createElement('div');
      error.className = 'jp-gpuviz-error';
      error.textContent = parsed;
      this.node.appendChild(error);
      return;
    }
    await this._render(parsed);
  }

  private async _render(result: IResult): Promise<void> {
    this.node.appendChild(heading(result.title));
    const summary = document.createElement('pre');
    summary.className = 'jp-gpuviz-summary';
    summary.textContent = result.summary.join('\n');
    this.node.appendChild(summary);
    const plots: [HTMLElement, IResult['figures'][number]][] = [];
    for (const figure of result.figures) {
      this.node.appendChild(heading(figure.title));
      const div = document.createElement('div');
      div.className = 'jp-gpuviz-figure';
      div.dataset.name = figure.name;
      this.node.appendChild(div);
      plots.push([div, figure]);
    }
    for (const t of result.tables) {
      this.node.appendChild(heading(t.title));
      const node = table(t.columns, t.rows);
      node.dataset.name = t.name;
      this.node.appendChild(node);
    }
    if (plots.length) {
      const Plotly = await import('plotly.js-dist-min'); // its own chunk, loaded on first use
      this._plotly = Plotly;
      for (const [div, figure] of plots) {
        await Plotly.newPlot(div, figure.figure.data, figure.figure.layout, { responsive: true });
      }
    }
  }

  dispose(): void {
    this._purge();
    super.dispose();
  }

  /** Release the plots drawn so far (plotly keeps listeners and data on each). */
  private _purge(): void {
    if (this._plotly === null) {
      return;
    }
    for (const div of Array.from(this.node.querySelectorAll<HTMLElement>('.jp-gpuviz-figure'))) {
      this._plotly.purge(div);
    }
  }

  private _mimeType: string;
  private _plotly: typeof import('plotly.js-dist-min') | null = null;
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  createRenderer: options => new ResultRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'gpuviz-labextension:result',
  rendererFactory,
  rank: 10, // below text/html (50): the static HTML fallback in the same bundle loses
  dataType: 'json',
  fileTypes: [
    {
      name: 'gpuviz-result',
      displayName: 'gpuviz result',
      mimeTypes: [MIME_TYPE],
      extensions: [FILE_EXTENSION],
      fileFormat: 'text'
    }
  ],
  documentWidgetFactoryOptions: {
    name: 'gpuviz result',
    primaryFileType: 'gpuviz-result',
    fileTypes: ['gpuviz-result'],
    defaultFor: ['gpuviz-result']
  }
};

export default extension;
