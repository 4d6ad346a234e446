// Draws every plot of the page: <div data-figure="ID"> and its <script id="ID" type="application/json">.
document.querySelectorAll("[data-figure]").forEach(function (element) {
  const figure = JSON.parse(document.getElementById(element.dataset.figure).textContent);
  const minWidth = figure.layout.meta && figure.layout.meta.min_width;
  if (minWidth) {  // more columns than a phone's width holds: the plot scrolls sideways in its figure, not the page
    element.style.minWidth = minWidth + "px";
    element.parentElement.classList.add("chart-scrolls");
  }
  Plotly.newPlot(element, figure.data, figure.layout, {responsive: true, displaylogo: false});
});
