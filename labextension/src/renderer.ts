// Draws a gpuviz result: summary lines, plotly figures and tables (DOM text only).
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { IResult, parseResult } from './format';

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

/** A widget that shows one result (or why it cannot). */
export class ResultView extends Widget {
  constructor() {
    super();
    this.addClass(CLASS_NAME);
  }

  /** Draw ``data`` if it is a result this extension reads, else say why not. */
  async showResult(data: unknown): Promise<void> {
    const parsed = parseResult(data);
    if (typeof parsed === 'string') {
      this.showError(parsed);
      return;
    }
    this._clear();
    await this._render(parsed);
  }

  showError(message: string): void {
    this._clear();
    const error = document.createElement('div');
    error.className = 'jp-gpuviz-error';
    error.textContent = message;
    this.node.appendChild(error);
  }

  private _clear(): void {
    this._purge();
    this.node.textContent = '';
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

  private _plotly: typeof import('plotly.js-dist-min') | null = null;
}

/** The mime renderer: a ResultView fed from a notebook output or a .gpuviz.json file. */
export class ResultRenderer extends ResultView implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    await this.showResult(model.data[this._mimeType]);
  }

  private _mimeType: string;
}
