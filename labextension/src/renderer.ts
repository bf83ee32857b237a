// Draws a gpuviz result: summary lines, plotly figures and tables (DOM text only).
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { IClick, MapDrill } from './drill';
import { Cell, ColumnKind, IResult, ITable, parseResult } from './format';
import { fetchResult } from './server';
import { formatDuration, formatSize } from './units';

/** What plotly adds to a plotted element: its events. */
interface IPlotEvents {
  on(event: 'plotly_click', handler: (event: IClick) => void): void;
}

const CLASS_NAME = 'jp-gpuviz-result';

function heading(text: string): HTMLElement {
  const h = document.createElement('h3');
  h.textContent = text;
  return h;
}

function show(value: Cell, kind: ColumnKind): string {
  if (value === null) {
    return '';
  }
  if (typeof value === 'number') {
    switch (kind) {
      case 'bytes':
        return formatSize(value);
      case 'ns':
        return formatDuration(value);
      case 'share':
        return `${(value * 100).toFixed(1)}%`;
      case 'address':
        return '0x' + value.toString(16);
      default:
        return String(value);
    }
  }
  return String(value);
}

/** A table like the report's: human headers, formatted values, a totals row, highlighted
 * rows, and sorting by value (numbers as numbers) when a header is clicked. */
function table(t: ITable): HTMLTableElement {
  const kinds: ColumnKind[] = t.kinds ?? t.columns.map(() => 'text');
  const node = document.createElement('table');
  node.className = 'jp-gpuviz-table';
  const head = node.createTHead().insertRow();
  const body = node.createTBody();
  const highlight = new Set(t.highlight ?? []);
  const rows = t.rows.map((row, index) => ({ row, index }));
  const fill = (): void => {
    body.textContent = '';
    for (const { row, index } of rows) {
      const tr = body.insertRow();
      if (highlight.has(index)) {
        tr.className = 'jp-gpuviz-highlight';
      }
      const link = t.links?.[index];
      if (link) {
        tr.dataset.path = link; // a click opens that log's result (ResultView)
        tr.classList.add('jp-gpuviz-link');
        tr.title = `open ${link}`;
      }
      row.forEach((value, column) => {
        const td = tr.insertCell();
        td.textContent = show(value, kinds[column]);
        if (kinds[column] !== 'text' && kinds[column] !== 'address') {
          td.className = 'jp-gpuviz-number';
        }
      });
    }
  };
  (t.headers ?? t.columns).forEach((header, column) => {
    const th = document.createElement('th');
    th.textContent = header;
    th.title = 'sort';
    th.addEventListener('click', () => {
      const ascending = th.dataset.order !== 'asc';
      th.dataset.order = ascending ? 'asc' : 'desc';
      rows.sort((a, b) => {
        const x = a.row[column];
        const y = b.row[column];
        const order =
          typeof x === 'number' && typeof y === 'number'
            ? x - y
            : String(x ?? '').localeCompare(String(y ?? ''));
        return ascending ? order : -order;
      });
      fill();
    });
    head.appendChild(th);
  });
  fill();
  if (t.total) {
    const tr = node.createTFoot().insertRow();
    tr.className = 'jp-gpuviz-total';
    t.total.forEach((value, column) => {
      tr.insertCell().textContent = show(value, kinds[column]);
    });
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
    this._linked?.dispose();
    this._linked = null;
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
      if (figure.drill) {
        const nav = document.createElement('div');
        nav.className = 'jp-gpuviz-nav';
        nav.dataset.name = figure.name;
        this.node.appendChild(nav);
      }
      const div = document.createElement('div');
      div.className = 'jp-gpuviz-figure';
      div.dataset.name = figure.name;
      this.node.appendChild(div);
      plots.push([div, figure]);
    }
    for (const t of result.tables) {
      this.node.appendChild(heading(t.title));
      const node = table(t);
      node.dataset.name = t.name;
      node.addEventListener('click', event => {
        const row = (event.target as HTMLElement).closest<HTMLElement>('tr[data-path]');
        if (row?.dataset.path) {
          void this.openLinked(row.dataset.path);
        }
      });
      this.node.appendChild(node);
    }
    if (plots.length) {
      const Plotly = await import('plotly.js-cartesian-dist-min'); // its own chunk, loaded on first use
      this._plotly = Plotly;
      for (const [div, figure] of plots) {
        await Plotly.newPlot(div, figure.figure.data, figure.figure.layout, { responsive: true });
        const nav = div.previousElementSibling as HTMLElement | null;
        if (figure.drill && nav?.classList.contains('jp-gpuviz-nav')) {
          // a map of many segments: its overview, a click drills down to a group and to a segment
          const drill = new MapDrill(Plotly, div, nav, figure.figure, figure.drill);
          await drill.show();
          (div as unknown as IPlotEvents).on('plotly_click', event => drill.click(event));
        }
        const links = result.tables.find(t => t.name === figure.rows)?.links;
        if (links) {
          // a click on a row of this figure opens the link of the same row of the table
          (div as unknown as IPlotEvents).on('plotly_click', event => {
            const point = event.points[0]?.pointNumber;
            const link = links[Array.isArray(point) ? point[0] : (point ?? -1)];
            if (link) {
              void this.openLinked(link);
            }
          });
        }
      }
    }
  }

  /** Show the result of the log at ``path`` (under the server's root) below this one, in place
   * of the one opened before: a rank of a run, opened from its row. */
  async openLinked(path: string): Promise<void> {
    this._linked?.dispose();
    const view = new ResultView();
    view.addClass('jp-gpuviz-linked');
    view.node.dataset.path = path;
    this._linked = view;
    Widget.attach(view, this.node);
    view.node.scrollIntoView({ block: 'start' });
    const loading = document.createElement('div');
    loading.textContent = `opening ${path}…`;
    view.node.appendChild(loading);
    try {
      await view.showResult(await fetchResult(path));
    } catch (error) {
      view.showError(String((error as Error).message ?? error));
    }
  }

  dispose(): void {
    this._linked?.dispose();
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

  private _plotly: typeof import('plotly.js-cartesian-dist-min') | null = null;
  private _linked: ResultView | null = null;
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
