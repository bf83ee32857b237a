declare module 'plotly.js-cartesian-dist-min' {
  export function newPlot(
    root: HTMLElement,
    data: unknown[],
    layout?: Record<string, unknown>,
    config?: Record<string, unknown>
  ): Promise<HTMLElement>;
  export function react(
    root: HTMLElement,
    data: unknown[],
    layout?: Record<string, unknown>,
    config?: Record<string, unknown>
  ): Promise<HTMLElement>;
  export function purge(root: HTMLElement): void;
}
