// Measures the report as a person at 1,400 × 900 px would see it, for
// browser_test.go, and writes the result into the page as JSON.
(function () {
  var out = { innerWidth: innerWidth, innerHeight: innerHeight, first: {}, wide: [], clipped: [], links: [], ids: [] };
  function box(e) { var r = e.getBoundingClientRect(); return { top: r.top, bottom: r.bottom, left: r.left, right: r.right }; }
  function name(e) {
    var s = e.tagName + (e.id ? '#' + e.id : '');
    var d = e.parentElement && e.parentElement.closest('details');
    if (d) s += ' in ' + (d.id ? '#' + d.id : 'a section');
    return s + ' "' + (e.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 60) + '"';
  }
  window.scrollTo(0, 0);
  // The first screen: every section closed, as the page opens.
  document.querySelectorAll('[id]').forEach(function (e) { out.first[e.id] = box(e); out.ids.push(e.id); });
  out.height = document.documentElement.scrollHeight;
  // Then every section open: nothing may be wider than the column.
  document.querySelectorAll('details').forEach(function (d) { d.open = true; });
  var main = document.querySelector('main') || document.body;
  var cs = getComputedStyle(main), m = main.getBoundingClientRect();
  var left = m.left + parseFloat(cs.paddingLeft), right = m.right - parseFloat(cs.paddingRight);
  out.column = [left, right];
  main.querySelectorAll('*').forEach(function (e) {
    if (e.closest('svg') && e.tagName.toLowerCase() !== 'svg') return;
    var r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) return;
    if (r.right > right + 1 || r.left < left - 1) out.wide.push(name(e) + ' spans ' + Math.round(r.left) + '–' + Math.round(r.right));
    if (e.scrollWidth > e.clientWidth + 1 && /auto|scroll/.test(getComputedStyle(e).overflowX)) out.wide.push(name(e) + ' scrolls: ' + e.scrollWidth + ' px in ' + e.clientWidth);
  });
  out.wide = out.wide.slice(0, 50);
  // A chart label must lie within its drawing, else the page cuts it.
  document.querySelectorAll('svg').forEach(function (svg) {
    var vb = svg.viewBox && svg.viewBox.baseVal;
    if (!vb || !vb.width) return;
    svg.querySelectorAll('text').forEach(function (t) {
      var b = t.getBBox();
      if (b.x < vb.x - 0.5 || b.y < vb.y - 0.5 || b.x + b.width > vb.x + vb.width + 0.5 || b.y + b.height > vb.y + vb.height + 0.5)
        out.clipped.push(t.textContent + ' (' + Math.round(b.x) + '–' + Math.round(b.x + b.width) + ' of 0–' + vb.width + ')');
    });
  });
  var seen = {};
  document.querySelectorAll('a[href]').forEach(function (a) {
    var h = a.getAttribute('href');
    if (!seen[h]) { seen[h] = true; out.links.push(h); }
  });
  var pre = document.createElement('pre');
  pre.id = 'probe-result';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
