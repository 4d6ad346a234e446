// The results page shows one selection at a time: choosing a campaign disables the evaluation choice, and choosing
// an evaluation clears the campaign. Without script the page renders the same state once shown.
(() => {
  const evaluation = document.getElementById("evaluation");
  const campaign = document.getElementById("campaign");
  if (!evaluation || !campaign) return;
  const sync = () => { evaluation.disabled = campaign.value !== ""; };
  campaign.addEventListener("change", sync);
  evaluation.addEventListener("change", () => {
    if (evaluation.value !== "") campaign.value = "";
    sync();
  });
})();
