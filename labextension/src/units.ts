// Values for people, in the same words as gpuviz.base.units (format_size, format_duration).

const BINARY: [number, string][] = [
  [2 ** 40, 'TiB'],
  [2 ** 30, 'GiB'],
  [2 ** 20, 'MiB'],
  [2 ** 10, 'KiB']
];

/** Bytes in binary units: '256 B', '1.5 KiB', '702 MiB', '3.2 GiB'. */
export function formatSize(n: number): string {
  if (n < 0) {
    return '-' + formatSize(-n);
  }
  for (let i = 0; i < BINARY.length; i++) {
    const [factor, name] = BINARY[i];
    if (n >= factor) {
      const value = n / factor;
      const text = value < 9.95 ? value.toFixed(1) : value.toFixed(0);
      if (text === '1024' && i > 0) {
        return formatSize(factor * 1024);
      }
      return `${text} ${name}`;
    }
  }
  return `${Math.round(n)} B`;
}

/** Nanoseconds: '850 ns', '12.5 µs', '3.20 ms', '1.25 s', '2 min 5 s'. */
export function formatDuration(ns: number): string {
  if (ns < 0) {
    return '-' + formatDuration(-ns);
  }
  if (ns < 1e3) {
    return `${Math.round(ns)} ns`;
  }
  if (ns < 1e6) {
    return `${(ns / 1e3).toFixed(1)} µs`;
  }
  if (ns < 1e9) {
    return `${(ns / 1e6).toFixed(2)} ms`;
  }
  if (ns < 120e9) {
    return `${(ns / 1e9).toFixed(2)} s`;
  }
  return `${Math.floor(ns / 60e9)} min ${Math.round((ns % 60e9) / 1e9)} s`;
}
