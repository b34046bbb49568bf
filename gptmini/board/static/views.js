// The ATTENTION tab's views beyond the model and head views, loaded by index.js:
//
// - the neuron view: one head and one query token; the query vector and each key vector as the model computes them
//   (after RoPE and QK-norm when those are on), their elementwise products, each product's sum scaled to the score,
//   the softmax weight (and the learned sink's share), beside the weight the model itself logged;
// - the lens view: the logit lens on the text, layers down and tokens across, each cell the token the residual
//   stream after that layer predicts next and its probability, shaded by the probability of the token that does
//   come next;
// - the head map: one head's map large, with the tokens on both axes, the mean over the layer's heads beside it,
//   and the text coloured by the weights the picked query gives each token;
// - the circuits view: each head's direct logit attribution over the run's steps (heads x steps, from the
//   attribution route) and per token at the step shown; the Q-, K- or V-composition of successive layers as a
//   graph whose edge widths follow the scores at the step shown; the picked head's QK and OV circuits over the
//   probe's first distinct tokens.
//
// Hovering a token in any of these panels highlights that token in every panel. Every view reads the summary as
// decoded by index.js (decodeAttention): its header's sink, lens and vectors entries (gptmini.board.summary).

// what the three views show: the layer, head and query token picked (the query: null = the last token)
export const pick = {layer: 0, head: 0, query: null};

export const VIEWS = {neuron: 'Neuron view', lens: 'Lens view', map: 'Head map', circuits: 'Circuits'};
// the views that show one layer and head, and whether one query token too (the lens view shows every layer)
export const PICKED = {neuron: true, map: true, circuits: false};
// the composition the circuits view's graph shows: 'Q', 'K' or 'V'
const composition = {mode: 'K'};

// ---------------------------------------------------------------------------------------------------------
// helpers

function half(bits) {
  // an IEEE half-precision float from its 16 bits
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

function float16s(b64) {
  const bytes = atob(b64);
  const out = new Float32Array(bytes.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = half(bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8));
  return out;
}

// the summary's queries and keys as floats, decoded once per summary
function vectorsOf(att) {
  if (!att.vectors) return null;
  if (!att._qk) att._qk = {q: float16s(att.vectors.q), k: float16s(att.vectors.k)};
  return att._qk;
}

function queryOf(att) {
  return pick.query === null || pick.query >= att.T ? att.T - 1 : pick.query;
}

// blue for negative, orange for positive, white at zero; `v` in [-1, 1]
function diverging(v) {
  const t = Math.min(1, Math.abs(v));
  return v >= 0
    ? `rgb(255,${Math.round(255 - 120 * t)},${Math.round(255 - 230 * t)})`
    : `rgb(${Math.round(255 - 220 * t)},${Math.round(255 - 140 * t)},255)`;
}

// a value shown on hover (its title) that the keyboard reaches too: focusable, named for screen readers, and said
// in the status while it has the keyboard's focus (not a click's: the status growing under the pointer between
// its press and release would lose the click)
export function reachable(ctx, node, text) {
  for (const [k, v] of [['title', text], ['aria-label', text], ['tabindex', 0]]) node.setAttribute(k, v);
  node.addEventListener('focus', () => { if (node.matches(':focus-visible')) ctx.setStatus(text); });
  node.addEventListener('blur', () => ctx.setStatus(''));
  return node;
}

// a canvas of rows x cols cells whose values the status says: the cell under the pointer, or, with the focus
// (its `label` said first), the cell the arrow keys move to (from the last row's first cell)
export function said(ctx, canvas, rows, cols, describe, label) {
  let r = rows - 1, c = 0;
  const say = () => ctx.setStatus(describe(r, c));
  reachable(ctx, canvas, `${label}\n(arrow keys: its values)`).setAttribute('role', 'img');
  canvas.addEventListener('mousemove', (e) => {
    const box = canvas.getBoundingClientRect();
    r = Math.min(rows - 1, Math.floor((e.clientY - box.top) / box.height * rows));
    c = Math.min(cols - 1, Math.floor((e.clientX - box.left) / box.width * cols));
    say();
  });
  canvas.addEventListener('keydown', (e) => {
    const [dr, dc] = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[e.key] || [];
    if (dr === undefined) return;
    e.preventDefault();
    r = Math.max(0, Math.min(rows - 1, r + dr));
    c = Math.max(0, Math.min(cols - 1, c + dc));
    say();
  });
  canvas.addEventListener('mouseleave', () => ctx.setStatus(''));
  return canvas;
}

// the note of a panel whose run lacks the layer or the head picked (null: it has both)
function lacking(ctx, att) {
  if (pick.layer < att.n_layer && pick.head < att.n_head) return null;
  return ctx.el('div', {class: 'note'}, `this run has ${ctx.plural(att.n_layer, 'layer')} × ` +
    `${ctx.plural(att.n_head, 'head')}: layer ${pick.layer}, head ${pick.head} is not in it`);
}

// a strip of cells, one per dimension, coloured by value / scale
function strip(ctx, values, scale, title) {
  const canvas = reachable(ctx, ctx.el('canvas', {width: values.length, height: 1, class: 'strip'}), title);
  const g = canvas.getContext('2d');
  values.forEach((v, d) => {
    g.fillStyle = diverging(v / scale);
    g.fillRect(d, 0, 1, 1);
  });
  canvas.style.width = `${Math.min(6 * values.length, 384)}px`;
  return canvas;
}

function token(ctx, att, i, cls = 'tok-label', text = `${i}: ${ctx.quoted(att.tokens[i])}`) {
  const node = reachable(ctx, ctx.el('span', {class: cls, 'data-tok': i}, ctx.shown(att.tokens[i])), text);
  for (const [on, tok] of [['mouseenter', i], ['mouseleave', null], ['focus', i], ['blur', null]]) {
    node.addEventListener(on, () => highlight(tok));
  }
  return node;
}

// every panel's labels of token i highlighted (null: none)
export function highlight(i) {
  for (const node of document.querySelectorAll('[data-tok].hl')) node.classList.remove('hl');
  if (i === null) return;
  for (const node of document.querySelectorAll(`[data-tok="${i}"]`)) node.classList.add('hl');
}

// ---------------------------------------------------------------------------------------------------------
// the pickers above the panels: layer, head, query token (the first panel's tokens)

export function pickBar(ctx, att, nLayer, nHead, view) {
  const select = (cls, n, value, label, onchange) => {
    const node = ctx.el('select', {class: cls, onchange: (e) => { onchange(Number(e.target.value)); ctx.redraw(); }});
    for (let x = 0; x < n; x++) {
      const o = ctx.el('option', {value: x}, label(x));
      if (x === value) o.selected = true;
      node.append(o);
    }
    return node;
  };
  pick.layer = Math.min(pick.layer, nLayer - 1);
  pick.head = Math.min(pick.head, nHead - 1);
  return ctx.el('div', {class: 'headbar pickbar'},
    select('pick-layer', nLayer, pick.layer, (l) => `layer ${l}`, (l) => { pick.layer = l; }),
    select('pick-head', nHead, pick.head, (h) => `head ${h}`, (h) => { pick.head = h; }),
    ...(PICKED[view] ? [ctx.el('span', {class: 'caption'}, 'query'), select('pick-query', att.T, queryOf(att),
      (i) => `${i}: ${ctx.shown(att.tokens[i])}`, (i) => { pick.query = i; })] : []));
}

// ---------------------------------------------------------------------------------------------------------
// the neuron view

// the neuron view's numbers for query i of head h in layer l: one row per key the query may see, with its
// elementwise products, score (q . k * scale + ALiBi's bias) and softmax weight; the sink's weight, or null
export function neuron(att, l, h, i) {
  const v = att.vectors, qk = vectorsOf(att);
  const hs = v.head_size, T = att.T;
  const at = (j) => ((l * att.n_head + h) * T + j) * hs;
  const q = qk.q.subarray(at(i), at(i) + hs);
  const rows = [];
  for (let j = 0; j <= i; j++) {
    if (v.window !== null && i - j >= v.window) continue;
    const k = qk.k.subarray(at(j), at(j) + hs);
    const products = Array.from(q, (x, d) => x * k[d]);
    const dot = products.reduce((a, b) => a + b, 0);
    const bias = v.slopes ? -v.slopes[h] * (i - j) : 0;
    // ALiBi's masks drop keys whose bias is below -80 (gptmini.attention.alibi.ALIBI_BIAS_FLOOR)
    if (bias < -80) continue;
    rows.push({key: j, k, products, dot, score: dot * v.scale + bias});
  }
  const sink = v.sink ? v.sink[l][h] : null;
  const top = Math.max(...rows.map((r) => r.score), sink === null ? -Infinity : sink);
  let total = sink === null ? 0 : Math.exp(sink - top);
  for (const r of rows) total += Math.exp(r.score - top);
  for (const r of rows) r.weight = Math.exp(r.score - top) / total;
  return {q, rows, sinkWeight: sink === null ? null : Math.exp(sink - top) / total};
}

export function neuronView(ctx, att) {
  const l = pick.layer, h = pick.head, i = queryOf(att);
  const missing = lacking(ctx, att);
  if (missing) return missing;
  const v = att.vectors;
  if (!v || l >= v.layers) {
    return ctx.el('div', {class: 'note'}, v
      ? `this summary keeps the queries and keys of layers 0–${v.layers - 1} only (its size cap): type your own text to see layer ${l}`
      : 'this summary holds no queries and keys (a run logged before the neuron view, or an attention that does not expose them): type your own text');
  }
  const n = neuron(att, l, h, i);
  const qScale = Math.max(1e-9, ...Array.from(n.q, Math.abs));
  const kScale = Math.max(1e-9, ...n.rows.map((r) => Math.max(...Array.from(r.k, Math.abs))));
  const pScale = Math.max(1e-9, ...n.rows.map((r) => Math.max(...r.products.map(Math.abs))));
  const table = ctx.el('table', {class: 'neuron'});
  table.append(ctx.el('tr', {},
    ctx.el('th', {}, 'key'), ctx.el('th', {}, `k (${v.head_size} dimensions)`), ctx.el('th', {}, 'q ⊙ k'),
    ctx.el('th', {}, 'Σ q⊙k'), ctx.el('th', {}, `score${v.slopes ? ' (+ ALiBi)' : ''}`),
    ctx.el('th', {}, 'weight'), ctx.el('th', {}, 'logged')));
  table.append(ctx.el('tr', {class: 'nv-query'},
    ctx.el('td', {}, 'query ', ctx.el('span', {class: 'nv-pos'}, String(i)), token(ctx, att, i)),
    ctx.el('td', {colspan: 6}, strip(ctx, Array.from(n.q), qScale, `q: ${Array.from(n.q, (x) => x.toFixed(2)).join(' ')}`))));
  const best = Math.max(...n.rows.map((r) => r.weight));
  for (const r of n.rows) {
    const logged = ctx.level(att, l, h, i, r.key) / ctx.levels();
    // the dimensions whose products add most to the score, for the hover
    const order = r.products.map((p, d) => [p, d]).sort((a, b) => b[0] - a[0]).slice(0, 4);
    const bar = ctx.el('span', {class: 'wbar'});
    bar.style.width = `${Math.round(60 * r.weight)}px`;
    table.append(ctx.el('tr', {
      class: 'nv-row' + (r.weight === best ? ' best' : ''),
      'data-key': r.key, 'data-weight': r.weight.toFixed(4), 'data-score': r.score.toFixed(4), 'data-logged': logged.toFixed(4),
    },
    ctx.el('td', {}, ctx.el('span', {class: 'nv-pos'}, String(r.key)), token(ctx, att, r.key)),
    ctx.el('td', {}, strip(ctx, Array.from(r.k), kScale, `k: ${Array.from(r.k, (x) => x.toFixed(2)).join(' ')}`)),
    ctx.el('td', {}, strip(ctx, r.products, pScale,
      `largest products: ${order.map(([p, d]) => `dim ${d}: ${p.toFixed(3)}`).join(', ')}`)),
    ctx.el('td', {class: 'num'}, r.dot.toFixed(2)),
    ctx.el('td', {class: 'num'}, r.score.toFixed(2)),
    ctx.el('td', {class: 'num'}, bar, r.weight.toFixed(3)),
    ctx.el('td', {class: 'num logged'}, logged.toFixed(2))));
  }
  if (n.sinkWeight !== null) {
    table.append(ctx.el('tr', {class: 'nv-sink', 'data-weight': n.sinkWeight.toFixed(4)},
      ctx.el('td', {}, 'sink'), ctx.el('td', {colspan: 3}, 'learned logit, no value'),
      ctx.el('td', {class: 'num'}, v.sink[l][h].toFixed(2)),
      ctx.el('td', {class: 'num'}, n.sinkWeight.toFixed(3)), ctx.el('td')));
  }
  const caption = ctx.el('div', {class: 'caption'},
    `layer ${l}, head ${h}, query ${i} ${ctx.quoted(att.tokens[i])}: score = Σ q⊙k × ${v.scale.toFixed(3)}` +
    `${v.slopes ? ' − slope × distance' : ''}; weight = softmax over the keys${n.sinkWeight !== null ? ' and the sink' : ''}` +
    '; logged: the model\'s own weight, as stored (to 1/255). Orange: positive, blue: negative.');
  return ctx.el('div', {}, caption, table);
}

// ---------------------------------------------------------------------------------------------------------
// the lens view

function green(p) {
  const t = Math.max(0, Math.min(1, p));
  return `rgb(${Math.round(255 - 200 * t)},${Math.round(255 - 90 * t)},${Math.round(255 - 170 * t)})`;
}

export function lensView(ctx, att) {
  const lens = att.lens;
  if (!lens) {
    return ctx.el('div', {class: 'note'},
      'this summary holds no logit lens (a run logged before it, or callbacks.attention_summary.lens=false)');
  }
  const table = ctx.el('table', {class: 'lens'});
  const head = ctx.el('tr', {}, ctx.el('th', {}, 'token'));
  const next = ctx.el('tr', {}, ctx.el('th', {}, 'next'));
  for (let t = 0; t < att.T; t++) {
    head.append(ctx.el('th', {}, token(ctx, att, t)));
    next.append(ctx.el('th', {class: 'next'}, t + 1 < att.T ? ctx.shown(att.tokens[t + 1]) : ''));
  }
  if (lens.loss) head.append(ctx.el('th', {}, 'loss'), ctx.el('th', {}, 'top-1'));
  table.append(head, next);
  lens.rows.forEach((name, r) => {
    const tr = ctx.el('tr', {'data-row': name}, ctx.el('th', {}, name === 'embed' ? 'embeddings' : name.replace('layer', 'after layer ')));
    for (let t = 0; t < att.T; t++) {
      const target = t + 1 < att.T ? lens.target[r][t] : null;
      const hit = t + 1 < att.T && lens.top[r][t] === att.tokens[t + 1];
      const p = lens.prob[r][t];
      const td = reachable(ctx, ctx.el('td', {class: 'lens-cell' + (hit ? ' hit' : ''), 'data-pos': t},
        ctx.el('div', {class: 'top'}, ctx.shown(lens.top[r][t])), ctx.el('div', {class: 'p'}, p === null ? '–' : p.toFixed(2))),
      `${name}, position ${t}: top ${ctx.quoted(lens.top[r][t])} ${p === null ? '–' : p.toFixed(3)}` +
        (target === null ? '' : `; next token ${ctx.quoted(att.tokens[t + 1])} ${target.toFixed(3)}`));
      td.style.background = green(target ?? 0);
      tr.append(td);
    }
    if (lens.loss) {
      tr.append(ctx.el('td', {class: 'num'}, lens.loss[r] === null ? '–' : lens.loss[r].toFixed(2)),
        ctx.el('td', {class: 'num'}, lens.top1[r] === null ? '–' : lens.top1[r].toFixed(2)));
    }
    table.append(tr);
  });
  const caption = ctx.el('div', {class: 'caption'},
    'each cell: the token the residual stream after that layer predicts next (read through the final norm and the LM head) and its probability; ' +
    'green: the probability of the token that does come next; bold: the prediction is right. loss and top-1: over the whole text.');
  return ctx.el('div', {class: 'lens-wrap'}, caption, table);
}

// ---------------------------------------------------------------------------------------------------------
// the head map: one head large, the layer's mean beside it, the text coloured by the picked query's weights

const MAP_PX = 480;

function bigMap(ctx, att, weight, title) {
  const T = att.T, cell = Math.max(4, Math.min(24, Math.floor(MAP_PX / T)));
  const canvas = ctx.el('canvas', {width: T * cell, height: T * cell, class: 'bigmap'});
  const g = canvas.getContext('2d');
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      if (j > i) g.fillStyle = '#f5f5f5';
      else {
        const v = Math.sqrt(weight(i, j));
        g.fillStyle = `rgb(${Math.round(255 - v * 247)},${Math.round(255 - v * 207)},${Math.round(255 - v * 148)})`;
      }
      g.fillRect(j * cell, i * cell, cell, cell);
    }
  }
  const rows = ctx.el('div', {class: 'axis-y'}, ...att.tokens.map((_, i) => token(ctx, att, i)));
  const cols = ctx.el('div', {class: 'axis-x'}, ...att.tokens.map((_, j) => token(ctx, att, j)));
  for (const axis of [rows, cols]) axis.style.setProperty('--cell', `${cell}px`);
  said(ctx, canvas, T, T, (i, j) => {
    highlight(j);
    return `${title}: query ${ctx.quoted(att.tokens[i])} (${i}) → key ${ctx.quoted(att.tokens[j])} (${j})` +
      (j > i ? ': masked' : `: ${weight(i, j).toFixed(2)}`);
  }, `${title}: rows queries, columns keys`);
  return ctx.el('div', {class: 'bigmap-wrap'}, ctx.el('div', {class: 'caption'}, title),
    ctx.el('div', {class: 'bigmap-grid'}, rows, canvas, ctx.el('span'), cols));
}

export function headMapView(ctx, att) {
  const l = pick.layer, h = pick.head, i = queryOf(att);
  const missing = lacking(ctx, att);
  if (missing) return missing;
  const levels = ctx.levels();
  const one = (a, b) => ctx.level(att, l, h, a, b) / levels;
  const mean = (a, b) => {
    let s = 0;
    for (let x = 0; x < att.n_head; x++) s += ctx.level(att, l, x, a, b);
    return s / levels / att.n_head;
  };
  const text = ctx.el('div', {class: 'colored-tokens'},
    ctx.el('span', {class: 'caption'}, `query ${i} ${ctx.quoted(att.tokens[i])} gives: `));
  for (let j = 0; j < att.T; j++) {
    const w = j <= i ? one(i, j) : 0;
    const span = token(ctx, att, j, 'ct', j <= i ? `${j}: ${w.toFixed(3)}` : `${j}: after the query`);
    span.style.background = j <= i ? `rgba(245,124,0,${Math.sqrt(w).toFixed(3)})` : 'transparent';
    span.dataset.weight = w.toFixed(4);
    span.addEventListener('click', () => { pick.query = j; ctx.redraw(); });
    span.addEventListener('keydown', (e) => { if (e.key === 'Enter') span.click(); });
    text.append(span);
  }
  return ctx.el('div', {},
    text,
    ctx.el('div', {class: 'bigmaps'},
      bigMap(ctx, att, one, `layer ${l}, head ${h}`),
      bigMap(ctx, att, mean, `layer ${l}, mean over ${att.n_head} heads`)));
}

// ---------------------------------------------------------------------------------------------------------
// the circuits view

function maxAbs(values) {
  let m = 1e-9;
  for (const v of values) if (v !== null && Math.abs(v) > m) m = Math.abs(v);
  return m;
}

// a canvas of rows x cols cells coloured by value(r, c) / scale (blue negative, orange positive); hover and the
// arrow keys say describe(r, c)
function cellMap(ctx, rows, cols, value, scale, describe, cls, label, cell = 12) {
  const canvas = ctx.el('canvas', {width: cols * cell, height: rows * cell, class: cls});
  const g = canvas.getContext('2d');
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const v = value(r, c);
      g.fillStyle = v === null ? '#eeeeee' : diverging(v / scale);
      g.fillRect(c * cell, r * cell, cell, cell);
    }
  }
  return said(ctx, canvas, rows, cols, describe, label);
}

const fmt = (v) => (v === null ? '–' : v.toFixed(3));

// heads x steps: filled in when the run's attribution arrives
function attributionOverSteps(ctx, att, run) {
  const box = ctx.el('div', {class: 'circuit-block attribution-steps'},
    ctx.el('div', {class: 'caption'}, 'direct logit attribution of each head over training (rows: heads; columns: logged steps; the step shown framed)'));
  if (run === undefined) {  // your own text: one checkpoint, no steps
    box.append(ctx.el('div', {class: 'note'}, 'over training: the logged validations (back to the logged probe to see them)'));
    return box;
  }
  ctx.attributionOf(run).then((body) => {
    const heads = [];
    body.values.forEach((layer, l) => layer.forEach((series, h) => heads.push({l, h, series})));
    if (!heads.length) {
      box.append(ctx.el('div', {class: 'note'}, 'this run logged no attribution/ scalars (callbacks.head_insight)'));
      return;
    }
    const steps = body.steps;
    const scale = maxAbs(heads.flatMap((x) => x.series));
    const canvas = cellMap(ctx, heads.length, steps.length, (r, c) => heads[r].series[c], scale,
      (r, c) => `layer ${heads[r].l}, head ${heads[r].h}, step ${steps[c]}: attribution ${fmt(heads[r].series[c])}`,
      'attr-steps', 'direct logit attribution of each head over the logged steps',
      Math.max(3, Math.min(12, Math.floor(480 / steps.length))));
    canvas.dataset.heads = heads.length;
    canvas.dataset.steps = steps.join(',');
    const at = steps.indexOf(att.step);
    const frame = ctx.el('div', {class: 'attr-steps-wrap'}, canvas);
    if (at >= 0) {
      const mark = ctx.el('div', {class: 'step-mark'});
      const w = canvas.width / steps.length;
      mark.style.left = `${at * w}px`;
      mark.style.width = `${w}px`;
      frame.append(mark);
    }
    const labels = ctx.el('div', {class: 'attr-labels'}, ...heads.map(({l, h}) => ctx.el('div', {}, `L${l} H${h}`)));
    labels.style.setProperty('--cell', `${canvas.height / heads.length}px`);
    box.append(ctx.el('div', {class: 'attr-grid'}, labels, frame),
      ctx.el('div', {class: 'caption'}, `steps ${steps[0]}–${steps[steps.length - 1]}; colour scale ±${scale.toFixed(3)} (logit units)`));
  }).catch((err) => box.append(ctx.el('div', {class: 'error'}, err.message)));
  return box;
}

// per token at this step: heads down, the positions across (each the head's push on the token that comes next)
function attributionPerToken(ctx, att) {
  const a = att.circuits.attribution;
  const heads = [];
  a.forEach((layer, l) => layer.forEach((row, h) => heads.push({l, h, row})));
  const scale = maxAbs(heads.flatMap((x) => x.row));
  const table = ctx.el('table', {class: 'attr-tokens'});
  const top = ctx.el('tr', {}, ctx.el('th', {}, 'next →'));
  for (let t = 0; t + 1 < att.T; t++) {
    top.append(reachable(ctx, ctx.el('th', {}, ctx.shown(att.tokens[t + 1])), `position ${t} predicts ${ctx.quoted(att.tokens[t + 1])}`));
  }
  table.append(top);
  for (const {l, h, row} of heads) {
    const tr = ctx.el('tr', {'data-layer': l, 'data-head': h}, ctx.el('th', {}, `L${l} H${h}`));
    row.forEach((v, t) => {
      const td = reachable(ctx, ctx.el('td', {class: 'attr-cell', 'data-value': fmt(v)}),
        `layer ${l}, head ${h}: ${fmt(v)} to the logit of ${ctx.quoted(att.tokens[t + 1])} after ${ctx.quoted(att.tokens[t])}`);
      td.style.background = v === null ? '#eeeeee' : diverging(v / scale);
      tr.append(td);
    });
    table.append(tr);
  }
  return ctx.el('div', {class: 'circuit-block'},
    ctx.el('div', {class: 'caption'}, `per token at this step: each head's push on the logit of the token that comes next (orange: up, blue: down; scale ±${scale.toFixed(3)})`),
    ctx.el('div', {class: 'attr-tokens-wrap'}, table));
}

// the composition graph: a column of heads per layer, an edge from each head to each head of the next layer,
// its width following the score (0..1) of the mode picked
function compositionGraph(ctx, att) {
  const SVG = 'http://www.w3.org/2000/svg';
  const node = (tag, attrs) => {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    return n;
  };
  const L = att.n_layer, H = att.n_head, gapX = 160, gapY = 28, pad = 40;
  const width = pad * 2 + (L - 1) * gapX, height = pad + H * gapY;
  const graph = node('svg', {width, height, viewBox: `0 0 ${width} ${height}`, class: 'composition'});
  const x = (l) => pad + l * gapX, y = (h) => pad / 2 + h * gapY + gapY / 2;
  const grids = att.circuits.composition[composition.mode];
  grids.forEach((grid, l) => grid.forEach((row, a) => row.forEach((score, b) => {
    if (score === null) return;
    const line = node('line', {x1: x(l), y1: y(a), x2: x(l + 1), y2: y(b), stroke: '#f57c00',
      'stroke-width': (0.25 + 10 * score).toFixed(2), 'stroke-opacity': Math.min(1, 0.15 + score).toFixed(2),
      'data-from': `${l},${a}`, 'data-to': `${l + 1},${b}`, 'data-score': score.toFixed(3)});
    const title = node('title', {});  // an SVG element's hover text
    title.textContent = `${composition.mode}-composition of layer ${l} head ${a} on layer ${l + 1} head ${b}: ${score.toFixed(3)}`;
    line.append(title);
    graph.append(reachable(ctx, line, title.textContent));
  })));
  for (let l = 0; l < L; l++) {
    const label = node('text', {x: x(l), y: height - 4, 'text-anchor': 'middle', class: 'comp-layer'});
    label.textContent = `layer ${l}`;
    graph.append(label);
    for (let h = 0; h < H; h++) {
      graph.append(node('circle', {cx: x(l), cy: y(h), r: 7, class: 'comp-head', fill: '#fff', stroke: '#616161'}));
      const t = node('text', {x: x(l), y: y(h) + 3.5, 'text-anchor': 'middle', class: 'comp-head-label'});
      t.textContent = String(h);
      graph.append(t);
    }
  }
  const buttons = ctx.el('span', {class: 'tabs comp-modes'}, ...['Q', 'K', 'V'].map((m) => ctx.el('button', {
    class: `tab comp-${m}` + (m === composition.mode ? ' on' : ''),
    onclick: () => { composition.mode = m; ctx.redraw(); },
  }, `${m}-composition`)));
  return ctx.el('div', {class: 'circuit-block'},
    ctx.el('div', {class: 'caption'}, 'how much each head feeds the queries (Q), keys (K) or values (V) of each head of the next layer, from the weights; edge width: the score (0–1) at this step. Previous-token head → induction head: K.'),
    buttons, L > 1 ? graph : ctx.el('div', {class: 'note'}, 'one layer: no head feeds another'));
}

// the picked head's QK and OV circuits over the probe's first distinct tokens
function tokenCircuits(ctx, att) {
  const c = att.circuits, l = pick.layer, h = pick.head;
  if (!c._qk) c._qk = {qk: float16s(c.qk), ov: float16s(c.ov)};
  const n = c.circuit_tokens.length, at = ((l * att.n_head + h) * n) * n;
  const one = (name, title, rowsAre, colsAre) => {
    const m = c._qk[name].subarray(at, at + n * n);
    const scale = maxAbs(m);
    const canvas = cellMap(ctx, n, n, (r, col) => m[r * n + col], scale,
      (r, col) => `${title}: ${rowsAre} ${ctx.quoted(c.circuit_tokens[r])} → ${colsAre} ${ctx.quoted(c.circuit_tokens[col])}: ${m[r * n + col].toFixed(3)}`,
      `circuit-${name}`, `layer ${l}, head ${h}: ${title}`, Math.max(6, Math.min(16, Math.floor(320 / n))));
    const cols = ctx.el('div', {class: 'circuit-cols'}, ...c.circuit_tokens.map((tk) => ctx.el('span', {}, ctx.shown(tk))));
    const rows = ctx.el('div', {class: 'circuit-rows'}, ...c.circuit_tokens.map((tk) => ctx.el('span', {}, ctx.shown(tk))));
    for (const axis of [rows, cols]) axis.style.setProperty('--cell', `${canvas.width / n}px`);
    return ctx.el('div', {class: 'circuit-matrix'},
      ctx.el('div', {class: 'caption'}, `${title} (±${scale.toFixed(2)}); rows: ${rowsAre}, columns: ${colsAre}`),
      ctx.el('div', {class: 'bigmap-grid'}, rows, canvas, ctx.el('span'), cols));
  };
  return ctx.el('div', {class: 'circuit-block'},
    ctx.el('div', {class: 'caption'}, `layer ${l}, head ${h} on the token embeddings alone (the layer's norm gain folded in, no positions): QK, the score a query token gives a key token; OV, what attending to a token adds to each token's logit`),
    ctx.el('div', {class: 'bigmaps'},
      one('qk', 'QK circuit', 'query token', 'key token'),
      one('ov', 'OV circuit', 'attended token', 'logit of')));
}

export function circuitsView(ctx, att, run) {
  if (!att.circuits) {
    return ctx.el('div', {class: 'note'}, 'this summary holds no circuits (a run logged before them, or a model whose heads have no per-head decomposition: model.attn_gate, model.value_embeds)');
  }
  // the attribution and the composition are every head's: drawn whatever the layer and head picked
  return ctx.el('div', {class: 'circuits'},
    attributionOverSteps(ctx, att, run),
    attributionPerToken(ctx, att),
    compositionGraph(ctx, att),
    lacking(ctx, att) || tokenCircuits(ctx, att));
}

export const DRAW = {neuron: neuronView, lens: lensView, map: headMapView, circuits: circuitsView};
