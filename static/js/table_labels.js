// On a narrow screen (site.css, max-width 760px) each row of a table is shown as a block of "heading: value"
// lines, as a phone cannot show seven columns side by side. This gives every body cell the heading of its column
// (data-label, which the style sheet shows) and, as block display takes a table's semantics away, ARIA roles that
// keep them. Tables that a page replaces later (a campaign's live runs) are labelled again.
(function () {
  function label(table) {
    const headings = [];
    for (const th of table.querySelectorAll(":scope > thead > tr:last-child > th")) {
      for (let span = 0; span < th.colSpan; span++) headings.push(th.textContent.trim());
    }
    if (!headings.length) return;
    table.setAttribute("role", "table");
    table.querySelectorAll(":scope > thead th").forEach(th => th.setAttribute("role", "columnheader"));
    table.querySelectorAll(":scope > * > tr").forEach(row => row.setAttribute("role", "row"));
    for (const row of table.querySelectorAll(":scope > tbody > tr")) {
      let column = 0;
      for (const cell of row.children) {
        cell.setAttribute("role", "cell");
        if (cell.colSpan === 1 && headings[column]) cell.dataset.label = headings[column];
        column += cell.colSpan;
      }
    }
    table.classList.add("labelled");
  }
  function labelAll() {
    document.querySelectorAll("main table:not(.labelled)").forEach(label);
  }
  labelAll();
  new MutationObserver(labelAll).observe(document.querySelector("main"), {childList: true, subtree: true});
})();
