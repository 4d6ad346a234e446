// Draws every plot of the page: <div data-figure="ID"> and its <script id="ID" type="application/json">.
document.querySelectorAll("[data-figure]").forEach(function (element) {
  const figure = JSON.parse(document.getElementById(element.dataset.figure).textContent);
  Plotly.newPlot(element, figure.data, figure.layout, {responsive: true, displaylogo: false});
});
