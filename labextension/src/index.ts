// The mime extension: gpuviz results in notebook outputs and .gpuviz.json files.
// This file only wires; the format is in format.ts, the drawing in renderer.ts.
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { FILE_EXTENSION, MIME_TYPE } from './format';
import { ResultRenderer } from './renderer';

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
