// The fragmentation map's drill-down in a saved result: the figure is the overview (one row per
// group of segments, built by gpuviz.views.drilldown with overview.segment_groups), `drill`
// holds each group's map. A click on an overview row draws that group's map; a click on a
// segment's row draws that segment alone (the group's map kept to its row); the breadcrumbs
// above the plot go back up. Every figure comes from Python: nothing here groups segments.
import { IDrill, IFigure } from './format';

/** What a map figure's layout.meta says (gpuviz.views.drilldown). */
interface IMapMeta {
  view?: string;
  groups?: string[];
  group?: string;
  bases?: number[];
  sizes?: number[];
}

/** A plotly click: the point's row (a number on the overview, a segment's label on a map). */
export interface IClick {
  points: { y?: number | string; pointNumber: number | number[] }[];
}

/** The plotly functions the drill-down uses. */
export interface IPlotlyDraw {
  react(
    root: HTMLElement,
    data: unknown[],
    layout?: Record<string, unknown>,
    config?: Record<string, unknown>
  ): Promise<HTMLElement>;
}

function meta(figure: IFigure): IMapMeta {
  return (figure.layout.meta ?? {}) as IMapMeta;
}

function label(base: number): string {
  return '0x' + base.toString(16);
}

/** ``group``'s map kept to the row of the segment at ``base``. */
export function segmentFigure(group: IFigure, base: number): IFigure {
  const row = label(base);
  const info = meta(group);
  const size = (info.sizes ?? [])[(info.bases ?? []).indexOf(base)] ?? 0;
  const data = group.data.map(trace => {
    const t = trace as Record<string, unknown>;
    const ys = Array.isArray(t.y) ? (t.y as unknown[]) : [];
    const keep = ys.map((y, i) => (y === row ? i : -1)).filter(i => i >= 0);
    const out: Record<string, unknown> = { ...t };
    for (const key of ['y', 'x', 'base', 'hovertext', 'customdata', 'text']) {
      const values = t[key];
      if (Array.isArray(values) && values.length === ys.length) {
        out[key] = keep.map(i => values[i]);
      }
    }
    return out;
  });
  const layout = JSON.parse(JSON.stringify(group.layout)) as Record<string, any>;
  const yaxis = (layout.yaxis ?? {}) as Record<string, unknown>;
  layout.yaxis = { ...yaxis, categoryarray: [row], tickvals: [row], ticktext: [row] };
  const xaxis = (layout.xaxis ?? {}) as Record<string, unknown>;
  const reach = Array.isArray(xaxis.range) ? Number(xaxis.range[1]) : size;
  layout.xaxis = { ...xaxis, range: [0, Math.max(size, Math.min(reach, size * 1.25))] };
  delete layout.updatemenus; // (its buttons were the group's ranges)
  const heading = String((layout.title ?? {}).text ?? '').split(' · ')[0];
  layout.title = { text: `${heading} · segment ${row} (${info.group ?? ''})` };
  layout.height = 260;
  layout.meta = { ...info, view: 'segment', bases: [base], sizes: [size] };
  layout.uirevision = `segment:${row}`;
  return { data, layout };
}

/** The drill-down of one map: draws a level into ``div`` and keeps its breadcrumbs in ``nav``. */
export class MapDrill {
  constructor(
    private readonly plotly: IPlotlyDraw,
    private readonly div: HTMLElement,
    private readonly nav: HTMLElement,
    private readonly overview: IFigure,
    private readonly drill: IDrill
  ) {}

  /** Draw the overview, a group's map (``group``) or one of its segments (``group``, ``base``). */
  async show(group: string | null = null, base: number | null = null): Promise<void> {
    const found = this.drill.groups.find(g => g.name === group);
    let figure = this.overview;
    let view = 'overview';
    if (found !== undefined) {
      figure = base === null ? found.figure : segmentFigure(found.figure, base);
      view = base === null ? 'group' : 'segment';
    }
    await this.plotly.react(this.div, figure.data, figure.layout, { responsive: true });
    this.div.dataset.view = view;
    this._crumbs(view, found?.name ?? '', base);
  }

  /** A click on the drawn map: an overview row opens its group, a segment's row that segment. */
  click(event: IClick): void {
    const point = event.points[0];
    const info = meta(this._drawn());
    if (point === undefined || point.y === undefined) {
      return;
    }
    if (info.view === 'overview') {
      const name = (info.groups ?? [])[Math.round(Number(point.y))];
      if (name !== undefined) {
        void this.show(name);
      }
    } else if (info.view === 'group') {
      const base = (info.bases ?? []).find(b => label(b) === String(point.y));
      if (base !== undefined) {
        void this.show(info.group ?? null, base);
      }
    }
  }

  private _drawn(): IFigure {
    const layout = ((this.div as unknown as { layout?: Record<string, unknown> }).layout ?? {}) as Record<
      string,
      unknown
    >;
    return { data: [], layout };
  }

  private _crumbs(view: string, group: string, base: number | null): void {
    this.nav.textContent = '';
    const trail: [string, (() => void) | null][] = [];
    if (view === 'overview') {
      trail.push(['overview of the segments (click a row)', null]);
    } else {
      trail.push(['overview', () => void this.show()]);
      trail.push([group, view === 'segment' ? () => void this.show(group) : null]);
      if (view === 'segment' && base !== null) {
        trail.push([`segment ${label(base)}`, null]);
      }
    }
    trail.forEach(([text, action], i) => {
      if (i) {
        this.nav.appendChild(document.createTextNode(' \u203a '));
      }
      const item = document.createElement(action ? 'a' : 'span');
      item.textContent = text;
      if (action) {
        item.setAttribute('href', '#');
        item.addEventListener('click', event => {
          event.preventDefault();
          action();
        });
      }
      this.nav.appendChild(item);
    });
  }
}
