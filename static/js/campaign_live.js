// A campaign's page: refresh the live part every 2 s while runs are queued or running; stop when the campaign is done.
(function () {
  const box = document.getElementById("campaign-live");
  async function poll() {
    if (box.querySelector("[data-live='true']") === null) return;
    try {
      const response = await fetch(box.dataset.url, {headers: {"X-Requested-With": "fetch"}});
      if (response.ok) box.innerHTML = await response.text();
    } catch (error) { /* the server restarts; try again */ }
    setTimeout(poll, 2000);
  }
  setTimeout(poll, 2000);
})();
