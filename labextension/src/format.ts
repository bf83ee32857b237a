// The wire format of a gpuviz result, as written by gpuviz.views.result (Python).
// tests/test_labextension.py checks that these constants match the Python side.

export const MIME_TYPE = 'application/vnd.gpuviz.v1+json';
export const FORMAT = 'gpuviz-result';
export const FORMAT_VERSION = 1;
export const FILE_EXTENSION = '.gpuviz.json';
/** Saved event logs, opened through the server extension's route. */
export const LOG_EXTENSION = '.arrow';
/** Traces of other tools that gpuviz.load opens too (the server tells formats by content):
 * PyTorch memory snapshots, XPlane, XProf memory profiles. */
export const TRACE_EXTENSIONS = ['.pickle', '.xplane.pb', '.memory_profile.json', '.memory_profile.json.gz'];
/** A run manifest: opens a distributed run (the logs of its folder, or those it names). */
export const RUN_EXTENSION = '.gpuviz-run';
export const RESULT_ROUTE = ['gpuviz', 'result'];

/** A plotly figure as plotly.py writes it (`fig.to_plotly_json()`). */
export interface IFigure {
  data: unknown[];
  layout: Record<string, unknown>;
}

/** How a table column's raw values are shown and sorted. */
export type ColumnKind = 'text' | 'bytes' | 'ns' | 'count' | 'share' | 'address';

export type Cell = string | number | null;

export interface ITable {
  name: string;
  title: string;
  columns: string[];
  rows: Cell[][];
  /** Optional: human column headers, a kind per column, a totals row, rows to highlight. */
  headers?: string[];
  kinds?: ColumnKind[];
  total?: Cell[] | null;
  highlight?: number[];
  /** Optional: per row, the path (under the server's root) of a log whose result a click on the row opens. */
  links?: (string | null)[];
}

/** A map's drill-down (a heap of many segments, whose figure is the overview): each group's
 * map, in the overview's row order (gpuviz.views.result, gpuviz.views.drilldown). */
export interface IDrill {
  groups: { name: string; figure: IFigure }[];
}

export interface IResult {
  format: typeof FORMAT;
  version: number;
  title: string;
  /** Plain-text summary lines (diagnosis of the run). */
  summary: string[];
  /** ``rows``, optional: the name of a table whose row i is this figure's y row i (a click opens its link).
   * ``drill``, optional: the figure is a map's overview and these are its groups' maps. */
  figures: { name: string; title: string; figure: IFigure; rows?: string; drill?: IDrill }[];
  tables: ITable[];
}

/** The result in `data`, or an explanation of why it is not one this renderer reads. */
export function parseResult(data: unknown): IResult | string {
  if (typeof data !== 'object' || data === null) {
    return 'not a gpuviz result (expected a JSON object)';
  }
  const result = data as Partial<IResult>;
  if (result.format !== FORMAT) {
    return `not a gpuviz result (format ${JSON.stringify(result.format)})`;
  }
  if (result.version !== FORMAT_VERSION) {
    return `gpuviz result format version ${result.version}; this extension reads version ${FORMAT_VERSION}`;
  }
  if (!Array.isArray(result.summary) || !Array.isArray(result.figures) || !Array.isArray(result.tables)) {
    return 'malformed gpuviz result (summary, figures and tables must be lists)';
  }
  return result as IResult;
}
